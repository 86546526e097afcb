#!/usr/bin/env bash
# Set up, then start the app on the bundled offline demo pair (http://127.0.0.1:7860).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} GRADIO_ANALYTICS_ENABLED=False
exec .venv/bin/python launch.py "$@"
