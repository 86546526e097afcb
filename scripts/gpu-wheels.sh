#!/usr/bin/env bash
# Wheels that a lent GPU machine lacks, downloaded HERE (it has no network) into .whl/, which git
# ignores and the device call carries; scripts/gpu-check.sh unpacks them there. Only what fits:
# the tree plus the wheels must stay within 64 MiB (scripts/travel_size.py).
#
# - bitsandbytes: for the 8-bit/4-bit GPU tests. Its wheel holds a native library per CUDA and
#   ROCm release (tens of MiB); only the CUDA 12.6, 12.8 and 13.0 ones are kept (bitsandbytes
#   loads the nearest one of the runtime's CUDA major version). Dropped again when the
#   result does not fit, and the bitsandbytes tests then skip with that reason.
# - not gradio (the backend never imports it), not gguf (no GGUF file can travel).
#
# Usage: bash scripts/gpu-wheels.sh        (then carry ".whl" in the device call: docs/gpu.md)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
BITSANDBYTES=bitsandbytes==0.50.2  # the pyproject pin
KEEP_CUDA="126 128 130"

rm -rf .whl
mkdir -p .whl/download
"$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux2014_x86_64 -d .whl/download "$BITSANDBYTES" 2>&1 | grep -v "^WARNING: Location" || true
wheel=$(ls .whl/download/bitsandbytes-*.whl 2>/dev/null | head -1)
[ -n "$wheel" ] || { echo "gpu-wheels: could not download $BITSANDBYTES" >&2; exit 1; }

# A copy without the native libraries no H100/H200 with a current torch loads.
"$PYTHON" - "$wheel" ".whl/$(basename "$wheel")" "$KEEP_CUDA" <<'EOF'
import re, sys, zipfile
source, target, keep = sys.argv[1], sys.argv[2], sys.argv[3].split()
unused = re.compile(r"libbitsandbytes_(rocm|xpu)\d*\.so$|libbitsandbytes_cuda(\d+)\.so$")
with zipfile.ZipFile(source) as whole, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as slim:
    for item in whole.infolist():
        found = unused.search(item.filename)
        if found and not (found.group(2) and found.group(2) in keep):
            continue
        slim.writestr(item, whole.read(item.filename))
EOF
rm -rf .whl/download
echo "gpu-wheels: $(basename "$wheel"), CUDA libraries ${KEEP_CUDA// /, } only:" \
  "$(du -h ".whl/$(basename "$wheel")" | cut -f1)"
if ! line=$("$PYTHON" scripts/travel_size.py); then
  rm -f .whl/bitsandbytes-*.whl
  echo "gpu-wheels: bitsandbytes does not fit ($line); not carried, its tests will skip"
fi
echo "gpu-wheels: $("$PYTHON" scripts/travel_size.py)"
ls .whl
