"""Tokens per second of our engine against the reference EAGLE code (SafeAILab/EAGLE) on the
same target, head and prompts, greedy, at the same fixed trees; ours also with the auto tree.

    bash scripts/side-venvs.sh eagle-reference
    python -m tests.interop.reference_speed --eagle-source PATH/TO/SafeAILab-EAGLE \\
        --target assets/demo/target --head assets/demo/head-eagle3 \\
        --out bench-results/official-eagle-demo-eagle3

Both sides run in turns (ours, theirs, ours, theirs...) so that drift of a shared machine hits
both; each method keeps its fastest turn. Their best tree is the fastest of the fixed trees in
their code, and the ratio reported is our auto tree's tokens/s over it. Each side counts the
tokens it generated up to and including EOS (theirs may run a round past the budget) over its
own wall time, prompt by prompt, with the model already warm. Writes summary.md and
results.json to --out; exits 1 when our auto tree is below --min-ratio times their best.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from backend.bench.cli import parse_tree
from backend.bench.prompts import load_prompts
from backend.bench.report import summarize
from backend.bench.runner import BenchSpec, machine_description, run_bench
from backend.config import LoadConfig, TreeConfig
from backend.services.loading import load_pair
from backend.services.prompting import prompt_ids
from tests.interop.reference_tau import transformers4_copy, up_to_eos
from tests.interop.side_venv import OFFICIAL, SIDE_VENVS

DEFAULT_TREES = ("8/4/2", "12/5/3", "16/5/4", "16/5/10", "32/6/8", "chain6")


def run_theirs(args, pair, prompts: list[list[int]], trees: list[TreeConfig]) -> dict:
    """Their naive decoding and eagenerate at each tree: {method: (tokens, seconds, rounds,
    identical to their naive decoding)}."""
    python = SIDE_VENVS / "eagle-reference" / "bin" / "python"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        request = {
            "target": str(transformers4_copy(Path(args.target), work / "target")),
            "head": str(Path(args.head).resolve()),
            "kind": pair.head.kind.value,
            "trees": [
                {
                    "label": t.label(),
                    "total_tokens": t.total_tokens,
                    "depth": t.depth,
                    "top_k": t.top_k,
                }
                for t in trees
            ],
            "max_new_tokens": args.max_new_tokens,
            "prompts": prompts,
            "threads": torch.get_num_threads(),
        }
        (work / "request.json").write_text(json.dumps(request))
        env = {
            **os.environ,
            "PYTHONPATH": str(Path(args.eagle_source).resolve()),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
        script = str(OFFICIAL / "reference_speed.py")
        subprocess.run([str(python), script, str(work)], env=env, check=True, cwd=tmp)
        answer = json.loads((work / "answer.json").read_text())
    eos = pair.engine.eos_ids
    plain = [up_to_eos(r["ids"], eos) for r in answer["vanilla"]]
    totals = {}
    for method, runs in answer.items():
        ids = [up_to_eos(r["ids"], eos) for r in runs]
        totals[method] = {
            "tokens": sum(map(len, ids)),
            "seconds": sum(r["seconds"] for r in runs),
            "rounds": sum(r["rounds"] for r in runs),
            "identical": sum(a[: len(b)] == b or b[: len(a)] == a for a, b in zip(ids, plain)),
        }
    return totals


def run_ours(pair, prompts, args, trees: list[TreeConfig]) -> dict:
    spec = BenchSpec(
        max_new_tokens=args.max_new_tokens, methods=("vanilla", "eagle"), compare_trees=tuple(trees)
    )
    summaries = summarize(run_bench(pair, prompts, spec))
    return {
        ("vanilla" if m == "vanilla" else "auto" if m == "eagle" else m.split("@", 1)[1]): {
            "tokens": s.tokens,
            "seconds": s.seconds,
            "tau": s.tau,
            "identical": s.identical,
        }
        for m, s in summaries.items()
    }


def fastest(turns: list[dict]) -> dict:
    """Per method, the turn with the most tokens per second."""
    best: dict = {}
    for turn in turns:
        for method, row in turn.items():
            row = {**row, "tokens_per_s": row["tokens"] / row["seconds"]}
            if method not in best or row["tokens_per_s"] > best[method]["tokens_per_s"]:
                best[method] = row
    return best


def report(args, machine: str, ours: dict, theirs: dict, prompts: int) -> tuple[str, float]:
    their_best = max((m for m in theirs if m != "vanilla"), key=lambda m: theirs[m]["tokens_per_s"])
    ratio = ours["auto"]["tokens_per_s"] / theirs[their_best]["tokens_per_s"]
    lines = [
        f"Machine: {machine}. {prompts} bench prompts, greedy, at most {args.max_new_tokens} new "
        f"tokens, {args.turns} turns per side (fastest kept), float32.",
        "",
        f"Command: `python -m tests.interop.reference_speed {' '.join(sys.argv[1:])}`",
        "",
        "| method | ours tok/s | ours tau | reference tok/s | reference tau | ours / reference |",
        "|---|---|---|---|---|---|",
    ]
    for method in ["vanilla", "auto", *[m for m in theirs if m != "vanilla"]]:
        mine, other = ours.get(method), theirs.get(method)
        cells = [method]
        for row in (mine, other):
            if row is None:
                cells += ["-", "-"]
                continue
            tau = row.get("tau") or (row["tokens"] / row["rounds"] if method != "vanilla" else 1.0)
            cells += [f"{row['tokens_per_s']:.1f}", f"{tau:.2f}"]
        both = mine is not None and other is not None
        cells.append(f"{mine['tokens_per_s'] / other['tokens_per_s']:.2f}x" if both else "-")
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Plain decoding produced {ours['vanilla']['tokens']} tokens here and "
        f"{theirs['vanilla']['tokens']} in the reference (the same prompt ids and budget: they "
        "should match).",
        "",
        f"Our auto tree: {ours['auto']['tokens_per_s']:.1f} tok/s; the reference at its best tree "
        f"({their_best}): {theirs[their_best]['tokens_per_s']:.1f} tok/s: **{ratio:.2f}x**.",
    ]
    return "\n".join(lines) + "\n", ratio


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eagle-source", required=True, help="checkout of SafeAILab/EAGLE")
    parser.add_argument("--target", default="assets/demo/target")
    parser.add_argument("--head", default="assets/demo/head-eagle3")
    parser.add_argument("--trees", nargs="+", default=list(DEFAULT_TREES))
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--limit", type=int, default=20, help="first N bench prompts")
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--min-ratio", type=float, default=1.0)  # no slower than the reference
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if not (SIDE_VENVS / "eagle-reference" / "bin" / "python").is_file():
        print("side venv missing: bash scripts/side-venvs.sh eagle-reference", file=sys.stderr)
        return 2
    pair = load_pair(LoadConfig(target=args.target, head=args.head, dtype="float32"))
    prompts = load_prompts(limit=args.limit)
    encoded = [
        prompt_ids(
            pair.tokenizer, [{"role": "user", "content": p.text}], prompt_format=pair.prompt_format
        )
        for p in prompts  # as run_bench encodes them for our side: both run the same ids
    ]
    trees = [parse_tree(text) for text in args.trees]
    our_turns, their_turns = [], []
    for turn in range(args.turns):
        print(f"turn {turn + 1}/{args.turns}: ours", flush=True)
        our_turns.append(run_ours(pair, prompts, args, trees))
        print(f"turn {turn + 1}/{args.turns}: reference", flush=True)
        their_turns.append(run_theirs(args, pair, encoded, trees))
    ours, theirs = fastest(our_turns), fastest(their_turns)
    machine = machine_description(pair.engine.runner.device)
    text, ratio = report(args, machine, ours, theirs, len(prompts))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(text)
    results = {
        "ours": ours,
        "reference": theirs,
        "our_turns": our_turns,
        "reference_turns": their_turns,
        "ratio": ratio,
    }
    (out / "results.json").write_text(json.dumps(results, indent=2))
    print(text)
    return 0 if ratio >= args.min_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
