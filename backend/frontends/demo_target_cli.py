"""``python launch.py make-demo-target``: build the bundled demo target (tokenizer + small Llama
chat model) from offline text; models/demo/target.py does the work.

    python launch.py make-demo-target --minutes 70
    # interrupted? the same command resumes from work/demo-build/ckpt/last.pt
    python launch.py make-demo-target --export-only      # export the last checkpoint now
    python launch.py make-demo-target --fresh --minutes 70   # rebuild tokenizer/data, restart
"""

from __future__ import annotations

import argparse
from pathlib import Path

from backend.engine.device import choose_device
from backend.services.dtypes import DTYPES
from models.demo.corpus import SOURCE_NAMES
from models.demo.pretrain import ModelShape, TrainOptions
from models.demo.target import (
    DEFAULT_BENCH_DIR,
    DEFAULT_DATA_DIR,
    DEFAULT_MINUTES,
    DEFAULT_OUT_DIR,
    DEFAULT_WORK_DIR,
    DataOptions,
    TargetBuildConfig,
    build_target,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _path_arguments(parser.add_argument_group("paths"))
    _run_arguments(parser.add_argument_group("run control"))
    g = parser.add_argument_group("data and tokenizer")
    g.add_argument(
        "--sources", default=",".join(SOURCE_NAMES), help=f"comma list of {SOURCE_NAMES}"
    )
    g.add_argument("--max-docs-per-source", type=int, default=None)
    g.add_argument("--val-fraction", type=float, default=0.02)
    g.add_argument("--vocab-size", type=int, default=4096)
    g.add_argument(
        "--tokenizer-chars",
        type=int,
        default=8_000_000,
        help="characters of training text used to learn the BPE merges",
    )
    _model_arguments(parser)


def _path_arguments(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--data-dir",
        type=Path,
        default=DEFAULT_DATA_DIR,
        help="offline training text (read at run time)",
    )
    g.add_argument(
        "--bench-dir",
        default=str(DEFAULT_BENCH_DIR),
        help="benchmark prompts removed from training ('' to skip)",
    )
    g.add_argument(
        "--work-dir",
        type=Path,
        default=DEFAULT_WORK_DIR,
        help="tokenizer, token streams, checkpoints and train.log",
    )
    g.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR, help="export folder")


def _run_arguments(g: argparse._ArgumentGroup) -> None:
    opts = TrainOptions()
    g.add_argument(
        "--minutes",
        type=float,
        default=None,
        help=f"training time budget (default {DEFAULT_MINUTES:g} unless --steps is given); the "
        "cosine schedule follows it",
    )
    g.add_argument("--steps", type=int, default=None, help="step-driven schedule instead")
    g.add_argument(
        "--fresh",
        action="store_true",
        help="ignore the checkpoint and rebuild tokenizer and token streams",
    )
    g.add_argument("--export-only", action="store_true", help="export the last checkpoint and exit")
    g.add_argument("--no-export", action="store_true", help="do not export when training ends")
    g.add_argument(
        "--stop-after",
        type=int,
        default=None,
        help="checkpoint and stop after this many steps in this invocation",
    )
    g.add_argument("--ckpt-minutes", type=float, default=opts.ckpt_seconds / 60)
    g.add_argument("--ckpt-every-steps", type=int, default=None)
    g.add_argument("--log-every", type=int, default=opts.log_every)
    g.add_argument("--threads", type=int, default=1, help="CPU threads for torch (default 1)")
    g.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda, ...")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--export-dtype", choices=sorted(DTYPES), default="bfloat16")
    g.add_argument(
        "--log-file", type=Path, default=None, help="log file (default WORK_DIR/train.log)"
    )


def _model_arguments(parser: argparse.ArgumentParser) -> None:
    shape, opts = ModelShape(), TrainOptions()
    g = parser.add_argument_group("model shape")
    g.add_argument("--hidden", type=int, default=shape.hidden)
    g.add_argument("--layers", type=int, default=shape.layers)
    g.add_argument("--heads", type=int, default=shape.heads)
    g.add_argument("--kv-heads", type=int, default=shape.kv_heads)
    g.add_argument("--intermediate", type=int, default=shape.intermediate)
    g.add_argument("--max-positions", type=int, default=shape.max_positions)
    g = parser.add_argument_group("optimisation")
    g.add_argument("--seq-len", type=int, default=opts.seq_len)
    g.add_argument("--batch-size", type=int, default=opts.batch_size)
    g.add_argument("--lr", type=float, default=opts.lr)
    g.add_argument("--warmup-steps", type=int, default=opts.warmup_steps)
    g.add_argument("--weight-decay", type=float, default=opts.weight_decay)
    g.add_argument("--eval-windows", type=int, default=opts.eval_windows)


def build_config(args: argparse.Namespace) -> TargetBuildConfig:
    """The build's settings from the flags (a time budget of 70 minutes unless steps are given)."""
    minutes = (
        args.minutes if args.minutes is not None else (None if args.steps else DEFAULT_MINUTES)
    )
    train = TrainOptions(
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        weight_decay=args.weight_decay,
        steps=args.steps,
        budget_seconds=minutes * 60 if minutes else None,
        ckpt_seconds=args.ckpt_minutes * 60,
        ckpt_every_steps=args.ckpt_every_steps,
        log_every=args.log_every,
        eval_windows=args.eval_windows,
        stop_after=args.stop_after,
        seed=args.seed,
    )
    shape = ModelShape(
        hidden=args.hidden,
        layers=args.layers,
        heads=args.heads,
        kv_heads=args.kv_heads,
        intermediate=args.intermediate,
        max_positions=args.max_positions,
    )
    data = DataOptions(
        data_dir=Path(args.data_dir),
        bench_dir=Path(args.bench_dir) if args.bench_dir else None,
        sources=tuple(s.strip() for s in args.sources.split(",") if s.strip()),
        max_docs_per_source=args.max_docs_per_source,
        val_fraction=args.val_fraction,
        vocab_size=args.vocab_size,
        tokenizer_chars=args.tokenizer_chars,
    )
    return TargetBuildConfig(
        work_dir=Path(args.work_dir),
        out_dir=Path(args.out_dir),
        log_file=Path(args.log_file) if args.log_file else None,
        data=data,
        shape=shape,
        train=train,
        fresh=args.fresh,
        export_only=args.export_only,
        export=not args.no_export,
        export_dtype=args.export_dtype,
        threads=args.threads,
        device=str(choose_device(args.device)),
    )


def run(args: argparse.Namespace) -> int:
    return build_target(build_config(args))
