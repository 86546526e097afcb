#!/usr/bin/env bash
# Set up, then start the app on the bundled demo pair (http://127.0.0.1:7860).
# The Hub stays reachable for downloads from the Models tab; the app goes offline by itself
# when the Hub cannot be reached. `bash scripts/run.sh --offline` (or HF_HUB_OFFLINE=1) never
# contacts it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export GRADIO_ANALYTICS_ENABLED=False
exec .venv/bin/python launch.py "$@"
