#!/usr/bin/env bash
# Regenerate the benchmark results the docs cite, each into bench-results/NAME (replaced).
# docs/performance.md says which table each one feeds and how long the whole suite takes.
# Run it on a quiet machine: nothing else may share the cores meanwhile.
# Usage: bash scripts/reproduce-results.sh [NAME ...]   (default: every NAME, in order)
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=${EAGLECHAT_SHARED:-../shared}
PY=.venv/bin/python
TREES=(8/4/2 12/5/3 16/5/4 16/5/10 32/6/8 chain6)
PROSE=$SHARED/data/tinystories/tinystories_val.txt
WIKI=$SHARED/data/llamafactory/wiki_demo.txt
LOOPING_PROMPT="The printing press changed how ideas travelled across Europe. Before it, books were copied by hand"
COLD=(--cold-runs 3 --repeats 1)
ONCE=(--cold-runs 1 --repeats 1)  # the slowest Gemma suites: one cold run (tens of minutes each)
TUNER_BEFORE=b56979a  # the last revision with the tuner of scouts, lessons and time families
GEMMA_TREES=(12/5/3 chain6)
NAMES=(demo-eagle3-trees demo-eagle1-trees demo-partial-trees demo-repeats ab-demo-eagle3
       ab-demo-eagle1 ab-demo-partial ab-gemma random-head long-prompts gemma-trees
       gemma-repeats-t0 gemma-repeats-t1 gemma-nohead-repeats gemma-nohead-prose gemma-int8
       gemma-int8-wiki gemma-race-loop gemma-load official-eagle-demo-eagle3)

bench() {  # NAME ARGS...: one bench command into bench-results/NAME
    local name=$1
    shift
    rm -rf "bench-results/$name"
    $PY launch.py bench "$@" --out "bench-results/$name"
}

suite() {
    case $1 in
        demo-eagle3-trees)
            bench "$1" --pair demo --drafts both head --compare-trees "${TREES[@]}" \
                --no-prompt-lookup "${COLD[@]}" ;;
        demo-eagle1-trees)
            bench "$1" --target assets/demo/target --head assets/demo/head-eagle1 \
                --drafts both head --compare-trees "${TREES[@]}" --no-prompt-lookup "${COLD[@]}" ;;
        demo-partial-trees)
            [ -f work/partial/eagle3-124/config.json ] || bash scripts/make-partial-head.sh
            bench "$1" --target assets/demo/target --head work/partial/eagle3-124 \
                --drafts both head --compare-trees "${TREES[@]}" --no-prompt-lookup "${COLD[@]}" ;;
        demo-repeats)
            bench "$1" --pair demo --prompts repeats --drafts both head --no-prompt-lookup \
                "${COLD[@]}" ;;
        ab-demo-eagle3 | ab-demo-eagle1)  # this engine against the revision before the bandit tuner
            local head=assets/demo/head-${1#ab-demo-}
            bench "$1" --target assets/demo/target --head "$head" --drafts head --no-prompt-lookup \
                "${COLD[@]}" --against "$TUNER_BEFORE" ;;
        ab-demo-partial)  # the same A/B with the partly trained head
            [ -f work/partial/eagle3-124/config.json ] || bash scripts/make-partial-head.sh
            bench "$1" --target assets/demo/target --head work/partial/eagle3-124 --drafts head \
                --no-prompt-lookup "${COLD[@]}" --against "$TUNER_BEFORE" ;;
        ab-gemma)  # the same A/B on Gemma 3 270M, the prose of gemma-trees
            bench "$1" --pair gemma3-270m --prompts "$PROSE" --limit 8 --drafts head \
                --no-prompt-lookup "${COLD[@]}" --against "$TUNER_BEFORE" ;;
        random-head)  # random target and head of one shape: drafts that never hold
            bench "$1" --synthetic small --drafts head --no-prompt-lookup "${COLD[@]}" ;;
        long-prompts)  # drafts that always hold: round costs alone, at 32 and 1,536 tokens
            bench "$1" --synthetic small --perfect-drafts --prompt-tokens 32 1536 --limit 4 \
                --drafts head --compare-trees 8/4/2 16/5/4 32/6/8 chain6 --no-prompt-lookup ;;
        gemma-trees)
            bench "$1" --pair gemma3-270m --prompts "$PROSE" --limit 8 --drafts both head \
                --compare-trees "${GEMMA_TREES[@]}" --no-prompt-lookup "${COLD[@]}" ;;
        gemma-repeats-t0)
            bench "$1" --pair gemma3-270m --prompts repeats --limit 8 --drafts both head \
                --no-prompt-lookup "${COLD[@]}" ;;
        gemma-repeats-t1)
            bench "$1" --pair gemma3-270m --prompts repeats --limit 8 --drafts both head \
                --temperature 1 --seeds 3 --no-prompt-lookup "${ONCE[@]}" ;;
        gemma-nohead-repeats)
            bench "$1" --pair gemma3-270m --no-head --prompts repeats --limit 8 \
                --no-prompt-lookup "${COLD[@]}" ;;
        gemma-nohead-prose)
            bench "$1" --pair gemma3-270m --no-head --prompts "$PROSE" --limit 4 \
                --no-prompt-lookup "${ONCE[@]}" ;;
        gemma-int8)
            bash scripts/side-venvs.sh llama-cpp
            bench "$1" --pair gemma3-270m --quantize int8 --peer llama.cpp --prompts "$PROSE" \
                --limit 4 --no-prompt-lookup "${COLD[@]}" ;;
        gemma-int8-wiki)
            bash scripts/side-venvs.sh llama-cpp
            bench "$1" --pair gemma3-270m --quantize int8 --peer llama.cpp --prompts "$WIKI" \
                --limit 4 --no-prompt-lookup "${COLD[@]}" ;;
        gemma-load)  # three cold loads, each timing the round costs afresh; a short reply each
            bench "$1" --pair gemma3-270m --prompts repeats --limit 1 --max-new-tokens 16 \
                --drafts head --no-prompt-lookup --cold-runs 3 --repeats 1 ;;
        gemma-race-loop)  # the app's race on a prose opening that greedy Gemma repeats
            rm -rf "bench-results/$1"
            mkdir -p "bench-results/$1"
            $PY launch.py generate --pair gemma3-270m --race --json --max-new-tokens 256 \
                --prompt "$LOOPING_PROMPT" > "bench-results/$1/race.json"
            $PY - "bench-results/$1/race.json" > "bench-results/$1/race.md" <<'REPORT'
import json, sys
race = json.load(open(sys.argv[1]))
eagle, vanilla = race["eagle"], race["vanilla"]
print(f"Race, Gemma 3 270M with its head: EAGLE {eagle['tokens_per_s']:.1f} tok/s, vanilla "
      f"{vanilla['tokens_per_s']:.1f} tok/s, speedup {race['speedup']:.2f}x, "
      f"{'identical' if race['identical'] else 'different'} ({eagle['new_tokens']} tokens; "
      f"accepted drafts: {eagle['accepted_context']} context, {eagle['accepted_head']} head)")
REPORT
            cat "bench-results/$1/race.md" ;;
        official-eagle-demo-eagle3)  # the reference code is fetched, not installed
            bash scripts/side-venvs.sh eagle-reference
            rm -rf "bench-results/$1"
            $PY -m tests.interop.reference_speed --eagle-source "${EAGLE_SOURCE:?set EAGLE_SOURCE to a SafeAILab/EAGLE checkout}" \
                --target assets/demo/target --head assets/demo/head-eagle3 --turns 3 \
                --out "bench-results/$1" ;;
        *) echo "unknown result $1 (known: ${NAMES[*]})" >&2
           return 2 ;;
    esac
}

[ $# -gt 0 ] || set -- "${NAMES[@]}"
for name in "$@"; do
    start=$SECONDS
    suite "$name"
    echo "$name: $((SECONDS - start)) s"
done
