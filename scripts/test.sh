#!/usr/bin/env bash
# Set up (stack + test tools + headless Chromium for browser tests + side venvs of official
# EAGLE implementations), lint, run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
# Official implementations for the cross-implementation tests (tests/interop), cached; built
# beside the main setup (separate venvs, mostly disk work), logged to a file and shown after.
mkdir -p .cache
bash scripts/side-venvs.sh > .cache/side-venvs.log 2>&1 &
side_venvs=$!
bash scripts/setup.sh --test
if [ -f scripts/setup-browser.sh ]; then bash scripts/setup-browser.sh; fi
side_status=0
wait "$side_venvs" || side_status=$?
grep -v "^WARNING: Location" .cache/side-venvs.log || true
[ "$side_status" = 0 ] || { echo "side venvs failed (log: .cache/side-venvs.log)" >&2; exit 1; }
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 GRADIO_ANALYTICS_ENABLED=False
.venv/bin/ruff check .
# Two workers (pytest-xdist), each test file whole on one of them, so a file's module fixtures
# (a Gemma load, a vLLM server) are built once; the tests themselves run torch on one thread.
# EAGLECHAT_TEST_WORKERS=0 runs them in this process.
.venv/bin/python -m pytest -q -p no:cacheprovider \
    -n "${EAGLECHAT_TEST_WORKERS:-2}" --dist loadfile "$@"
