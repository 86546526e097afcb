"""``python launch.py bench``: vanilla vs EAGLE vs prompt lookup, saved as JSON, Markdown, PNG.

python launch.py bench --pair demo --out bench-results/demo-cpu
python launch.py bench --target PATH --head PATH --prompts ../shared/bench/mt_bench.jsonl
python launch.py bench --synthetic 8b --total-tokens 60 --depth 6 --top-k 10 --limit 5   # GPU costs
python launch.py bench --synthetic small --perfect-drafts --prompt-tokens 32 1536 --limit 3
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import get_args

from backend.bench.ab_runs import run_ab
from backend.bench.cold_runs import run_cold
from backend.bench.other_rows import PEERS, start_other_rows
from backend.bench.prompt_sets import SETS, build_set
from backend.bench.prompts import load_prompts
from backend.bench.report import label, write_reports
from backend.bench.runner import METHODS, BenchSpec, run_bench
from backend.bench.sweep import DEFAULT_FILLER, lengthen, run_sweep
from backend.bench.synthetic import SHAPES, write_synthetic_pair
from backend.config import DraftSources, LoadConfig, TreeConfig
from backend.engine.device import choose_device
from backend.errors import ConfigError
from backend.frontends.flags import add_flags
from backend.services.catalog import find_pair
from backend.services.dtypes import choose_dtype
from backend.services.loading import load_pair


def _add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--prompt-tokens",
        type=int,
        nargs="+",
        metavar="N",
        help="prompt-length sweep: run the bench once per length, each prompt lengthened to "
        "about N tokens by a passage of --sweep-text in front (e.g. 32 512 1536)",
    )
    parser.add_argument(
        "--sweep-text",
        default=str(DEFAULT_FILLER),
        help="text whose opening lengthens the prompts of a sweep (default: a public-domain "
        "book in ../shared/data)",
    )


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """How often each prompt runs: repeats, seeds, cold runs."""
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="runs per prompt and method, interleaved; the median run counts (noise guard)",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        default=3,
        help="at temperature > 0, run the prompt set once per seed and report the mean (default 3)",
    )
    parser.add_argument(
        "--cold-runs",
        type=int,
        default=0,
        metavar="N",
        help="run this bench N times, each in a new process with nothing saved from earlier "
        "runs (no calibration, no tuner state), under --out/run-1..N, and print the median of "
        "each ratio with every run's 90%% interval (the noise rule: docs/performance.md)",
    )
    parser.add_argument(
        "--against",
        metavar="REV",
        help="with --cold-runs N: alternate each cold run with one of git revision REV's bench "
        "(a worktree under .cache/ab) and print EAGLE's tokens/s here over there, per run and "
        "median (an A/B of two versions of the engine on this machine)",
    )


def _add_draft_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--drafts",
        nargs="+",
        choices=list(get_args(DraftSources)),
        default=["both"],
        help="draft sources of EAGLE's automatic rounds: head, context (copied from the prompt "
        "and the reply so far) or both; more than one adds a row per source (e.g. both head)",
    )
    parser.add_argument(
        "--no-head",
        action="store_true",
        help="load the target without its head: EAGLE rounds draft from the context alone "
        "(prompt-lookup mode)",
    )


def _add_other_rows_arguments(parser: argparse.ArgumentParser) -> None:
    """The rows beside ours: prompt lookup, the float32 target beside a quantized one, and
    peer programs (other_rows.py)."""
    parser.add_argument("--no-prompt-lookup", action="store_true", help="skip the peer baseline")
    add_flags(parser, "quantize")
    parser.add_argument(
        "--peer",
        choices=PEERS,
        help="also run this program on the target's GGUF file, interleaved: llama.cpp's plain "
        "decoding (side venv: bash scripts/side-venvs.sh llama-cpp)",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, "pair", "target", "head")
    parser.add_argument(
        "--synthetic",
        choices=sorted(SHAPES),
        help="random-weight Llama target + EAGLE-3 head of this shape (tiny, 1b, 8b): measures "
        "per-round costs where no trained pair of that size is at hand; the speedup is meaningless",
    )
    parser.add_argument(
        "--perfect-drafts",
        action="store_true",
        help="with --synthetic: target and head always choose the same token, so every draft "
        "is accepted; the speedup then shows round costs alone (e.g. over --prompt-tokens)",
    )
    parser.add_argument(
        "--prompts",
        help="FastChat-format JSONL, a .txt of plain text cut into passages, or a set whose "
        f"replies repeat their context ({', '.join(SETS)}; built from ../shared) (default: the "
        "built-in set)",
    )
    parser.add_argument(
        "--prompt-chars",
        type=int,
        default=600,
        help="passage length for a .txt prompt file (about 4 characters a token)",
    )
    parser.add_argument("--limit", type=int, help="use only the first N prompts")
    bench_defaults = {"max_new_tokens": 128, "depth": 5, "top_k": 4}
    tree_and_model = (
        "total-tokens",
        "depth",
        "top-k",
        "dtype",
        "readout",
        "decoder-forms",
        "round-threads",
    )
    add_flags(parser, "max-new-tokens", "temperature", *tree_and_model, defaults=bench_defaults)
    parser.add_argument(
        "--compare-trees",
        nargs="+",
        default=[],
        metavar="N/D/K",
        help="also run EAGLE with these fixed trees, in the same interleaved run "
        "(N/D/K = total tokens/depth/top-k, or chainD), e.g. 8/4/2 12/5/3 16/5/10 chain6",
    )
    _add_other_rows_arguments(parser)
    _add_draft_arguments(parser)
    _add_run_arguments(parser)
    _add_sweep_arguments(parser)
    parser.add_argument("--out", default=f"bench-results/run-{time.strftime('%Y%m%d-%H%M%S')}")


def parse_tree(text: str) -> TreeConfig:
    """``N/D/K`` (total tokens incl. the root, depth, top-k) or ``chainD``."""
    try:
        if text.startswith("chain"):
            depth = int(text.removeprefix("chain"))
            return TreeConfig(total_tokens=depth + 1, depth=depth, top_k=1)
        total, depth, top_k = (int(part) for part in text.split("/"))
        return TreeConfig(total_tokens=total, depth=depth, top_k=top_k)
    except ValueError as err:
        raise ConfigError(
            f"cannot read the tree {text!r}: {err}", hint="write N/D/K or chainD, e.g. 16/5/4"
        ) from err


def run(args: argparse.Namespace) -> int:
    if args.against:
        if not args.cold_runs:
            raise ConfigError("--against runs cold runs", hint="add --cold-runs N, e.g. 3")
        return run_ab(args.against, args.cold_runs, sys.argv[1:], Path(args.out))
    if args.cold_runs:
        return run_cold(args.cold_runs, sys.argv[1:], Path(args.out))
    if args.synthetic:
        with tempfile.TemporaryDirectory(prefix="eaglechat-synthetic-") as scratch:
            target, head = write_synthetic_pair(
                args.synthetic, Path(scratch), perfect=args.perfect_drafts
            )
            return _run(args, str(target), str(head))
    if args.no_head and args.compare_trees:
        raise ConfigError("fixed trees need a head", hint="leave out --no-head or --compare-trees")
    if args.pair:
        spec = find_pair(args.pair)
        head = None if args.no_head else spec.head
        return _run(args, spec.target, head, spec.dtype, spec.prompt_format)
    if args.target and (args.head or args.no_head):
        return _run(args, args.target, None if args.no_head else args.head)
    raise ConfigError("give --pair NAME, --target and --head (or --no-head), or --synthetic SHAPE")


def _run(
    args: argparse.Namespace,
    target: str,
    head: str | None,
    pair_dtype: str = "auto",
    prompt_format: str = "auto",
) -> int:
    tree = (
        TreeConfig(total_tokens=args.total_tokens, depth=args.depth, top_k=args.top_k)
        if args.total_tokens
        else TreeConfig(auto=True)
    )
    if args.prompts in SETS:
        prompts = build_set(args.prompts)[: args.limit]
    else:
        prompts = load_prompts(args.prompts, args.limit, args.prompt_chars)
    dtype = choose_dtype(args.dtype, choose_device(), preferred=pair_dtype)
    started = time.perf_counter()
    config = LoadConfig(
        target=target,
        head=head,
        dtype=dtype,
        quantization=args.quantize,
        prompt_format=prompt_format,  # type: ignore[arg-type]
        readout=args.readout,
        decoder_forms=args.decoder_forms,
        round_threads=args.round_threads,
    )
    pair = load_pair(config)
    load_s = time.perf_counter() - started - pair.calibration_s
    others = start_other_rows(pair, config, prompts, args.peer)
    try:
        return _bench(args, pair, prompts, tree, load_s, others)
    finally:
        others.close()


def _bench(args: argparse.Namespace, pair, prompts, tree: TreeConfig, load_s: float, others) -> int:
    methods = tuple(m for m in METHODS if not (m == "prompt_lookup" and args.no_prompt_lookup))
    methods += tuple(others.peers)
    spec = BenchSpec(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        tree=tree,
        methods=methods,
        repeats=args.repeats,
        seeds=args.seeds,
        compare_trees=tuple(parse_tree(text) for text in args.compare_trees),
        drafts=tuple(args.drafts),
    )

    def progress(index: int, total: int, method: str) -> None:
        print(f"\r[{index + 1}/{total}] {label(method):<32}", end="", file=sys.stderr, flush=True)

    command = "python launch.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    if args.prompt_tokens:
        return _sweep(
            args,
            pair,
            prompts,
            lambda ps: run_bench(pair, ps, spec, progress, others.peers),
            command,
        )
    result = run_bench(pair, prompts, spec, progress, others.peers)
    result.settings["load_s"] = round(load_s, 2)
    result.settings.update(others.settings)
    print(file=sys.stderr)
    write_reports(result, Path(args.out), command)
    print((Path(args.out) / "summary.md").read_text())
    print(f"saved {args.out}/results.json, summary.md, speed.png")
    return 0


def _sweep(args: argparse.Namespace, pair, prompts, bench, command: str) -> int:
    """``--prompt-tokens``: one bench per prompt length, then the sweep's table."""
    limit = pair.engine.runner.max_positions
    longest = max(args.prompt_tokens) + args.max_new_tokens
    if limit and longest > limit:
        raise ConfigError(
            f"{max(args.prompt_tokens)} prompt tokens + {args.max_new_tokens} new ones exceed "
            f"the model's context of {limit}",
            hint="choose shorter --prompt-tokens",
        )
    path = Path(args.sweep_text)
    if not path.is_file():
        raise ConfigError(f"sweep text {path} does not exist", hint="pass a text file")
    filler = path.read_text(encoding="utf-8", errors="replace")
    out = Path(args.out)

    def lengthen_to(items, tokens: int):
        return lengthen(items, pair.tokenizer, tokens, filler)

    run_sweep(args.prompt_tokens, bench, prompts, lengthen_to, out, command)
    print(file=sys.stderr)
    print((out / "sweep.md").read_text())
    print(f"saved {out}/sweep.md, sweep.json and one report per length")
    return 0
