#!/usr/bin/env bash
# A partly trained EAGLE-3 head for the demo target (a tenth of the bundled head's steps, on a
# quarter of its data: drafts right about half the time), for the tuner's benches. Not shipped.
# Usage: bash scripts/make-partial-head.sh [OUT_DIR]   (a few minutes on a CPU)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-work/partial/eagle3-124}
DATA=$(dirname "$OUT")/data.jsonl
[ -f "$DATA" ] || .venv/bin/python -c "
from pathlib import Path
from models.demo.build import make_head_data, DEFAULT_DATA_DIR
make_head_data(Path('assets/demo/target'), DEFAULT_DATA_DIR, (500, 100), 128, Path('$DATA'))"
.venv/bin/python launch.py train-head --target assets/demo/target --data "$DATA" --kind eagle3 \
    --out "$OUT" --batch-size 8 --max-length 512 --eval-prompts 16 --steps 124 \
    --lr 1e-3 --ttt-steps 5 --draft-vocab-size 2048
