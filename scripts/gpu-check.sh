#!/usr/bin/env bash
# The one command for a lent GPU machine (docs/gpu.md gives the exact device call): the gpu tests
# and `bench --synthetic 1b` in bfloat16 with perfect and with random drafts, within 8 minutes on
# one H100, with JSON and summary.md under OUT and one printed line per check.
#
#   bash scripts/gpu-check.sh OUT                  # checks for CUDA first: without, says so, exit 0
#   bash scripts/gpu-check.sh OUT --cpu-rehearsal  # the same steps here, on the CPU, in a fresh
#                                                  # venv holding only what the GPU machine has
#
# On the GPU machine it uses the machine's own python3 and installs nothing: wheels it lacks
# travel in .whl/ (scripts/gpu-wheels.sh) and are unpacked onto PYTHONPATH.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: bash scripts/gpu-check.sh OUT [--cpu-rehearsal]}
MODE=${2:-}
PYTHON=${PYTHON:-python3}

if [ "$MODE" = "--cpu-rehearsal" ]; then
  # What the GPU machine has (torch 2.11 with CUDA there; the CPU build of our pin here, on disk),
  # nothing more: no gradio, bitsandbytes or gguf.
  VENV=.cache/gpu-rehearsal/venv
  PINS=(torch==2.13.0 "transformers==5.17.*" accelerate huggingface_hub safetensors tokenizers
        pytest matplotlib numpy)
  start=$(date +%s)
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile "${PINS[@]}" 2>&1 \
    | grep -v "^WARNING: Location" || true
  for absent in gradio bitsandbytes gguf; do
    if "$VENV/bin/python" -c "import $absent" 2>/dev/null; then
      echo "rehearsal venv: $absent is installed, the GPU machine has none" >&2; exit 1
    fi
  done
  echo "[PASS] rehearsal venv: fresh, ${PINS[*]} ($(( $(date +%s) - start )) s)"
  exec "$VENV/bin/python" scripts/gpu_check.py "$OUT" --device cpu --bench-shape tiny
elif [ -n "$MODE" ]; then
  echo "unknown option $MODE (the only one is --cpu-rehearsal)" >&2; exit 2
fi

# CUDA first, in seconds: torch says, or (no torch in python3) the driver does.
if cuda=$(timeout 25 "$PYTHON" -c "import torch; print(torch.cuda.is_available())" 2>/dev/null); then
  :
else
  cuda="no torch"
fi
if [ "$cuda" != "True" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; then
    echo "a GPU is present but $PYTHON's torch cannot use it (torch: $cuda); nothing was checked" >&2
    exit 1
  fi
  echo "no GPU found ($PYTHON: ${cuda/False/torch sees no CUDA device}): nothing to check on this" \
    "machine; run it on a lent GPU machine (docs/gpu.md), or rehearse with --cpu-rehearsal"
  exit 0
fi
exec "$PYTHON" scripts/gpu_check.py "$OUT"
