#!/usr/bin/env bash
# Set up (stack + test tools + headless Chromium for browser tests + side venvs of official
# EAGLE implementations), lint, run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
if [ -f scripts/setup-browser.sh ]; then bash scripts/setup-browser.sh; fi
# Official implementations for the cross-implementation tests (tests/interop), cached.
bash scripts/side-venvs.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 GRADIO_ANALYTICS_ENABLED=False
.venv/bin/ruff check .
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
