"""The flags of ``python launch.py train-head`` (train_cli.py runs it): data, continuations,
head shape and feature cache, evaluation.
"""

from __future__ import annotations

import argparse

from backend.frontends.flags import add_flags
from backend.frontends.train_eval import BENCH_MAX_NEW_TOKENS, BENCH_TREE
from models.heads.config import HeadKind

HELD_OUT_NAME = "held_out.jsonl"  # in --out: the held-out text as bench prompts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, "pair")
    parser.add_argument("--target", help="local directory of the target model, or its .gguf file")
    add_flags(parser, "gguf-file")
    parser.add_argument(
        "--data", nargs="+", help="ShareGPT JSON/JSONL, prompt JSONL or .txt (several allowed)"
    )
    parser.add_argument(
        "--text",
        action="store_true",
        help="the data is plain text to continue (base models): every token is trained, "
        "a held-out share of it is never trained on and gives the evaluation prompts",
    )
    parser.add_argument(
        "--held-out-share",
        type=float,
        default=0.05,
        help="--text: share of the lines (.txt) or records (JSON) held out, chosen by content; "
        f"their passages are written to OUT/{HELD_OUT_NAME} for the bench",
    )
    parser.add_argument(
        "--held-out-continued",
        type=int,
        default=0,
        metavar="N",
        help="--text: also write OUT/held_out-continued.jsonl, the first N held-out passages "
        "each followed by the target's greedy continuation (--regen-max-new-tokens), as bench "
        "prompts",
    )
    parser.add_argument("--kind", choices=[k.value for k in HeadKind], help="default: --pair's")
    parser.add_argument("--out", help="output directory of the head")
    parser.add_argument("--steps", type=int, default=0, help="optimizer steps (0 = --epochs)")
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=2048, help="tokens per sequence")
    parser.add_argument("--warmup-steps", type=int, default=None)
    _add_regeneration_arguments(parser)
    _add_head_arguments(parser)
    parser.add_argument("--checkpoint-every", type=int, default=500)
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    _add_evaluation_arguments(parser)
    add_flags(parser, "dtype")
    parser.add_argument("--device", default=None, help="cuda:0, cpu, ... (default: best found)")
    parser.add_argument("--seed", type=int, default=0)


def _add_regeneration_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--regenerate",
        action="store_true",
        help="train on what the target writes itself: its replies (chat data, recommended), "
        "or with --text its continuations of prompts cut from the text",
    )
    parser.add_argument("--regen-max-new-tokens", type=int, default=256)
    parser.add_argument(
        "--regen-temperature",
        type=float,
        default=0.0,
        help="0 = greedy; with --text the temperature of the sampled share",
    )
    parser.add_argument(
        "--regen-sampled-share",
        type=float,
        default=0.0,
        help="--text: share of the prompts continued by sampling, the rest greedily",
    )
    parser.add_argument(
        "--regen-prompts", type=int, default=0, help="--text: at most this many prompts (0 = all)"
    )
    parser.add_argument(
        "--regen-prompt-chars",
        type=int,
        default=600,
        help="--text: the text is cut into prompts of this many characters",
    )
    parser.add_argument("--regen-batch-size", type=int, default=16, help="--text: per generate")


def _add_head_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--draft-vocab-size",
        type=int,
        default=None,
        help="EAGLE-3 reduced draft vocabulary (e.g. 32000)",
    )
    parser.add_argument("--ttt-steps", type=int, default=7, help="EAGLE-3 training-time test")
    parser.add_argument(
        "--draft-readout-only",
        action="store_true",
        help="EAGLE-3: compute the target's logits on the draft vocabulary only "
        "(much faster for large vocabularies)",
    )
    parser.add_argument(
        "--cache-features",
        metavar="DIR",
        help="keep the target's features and targets in DIR (float16 shards on disk): the "
        "target runs once per token, later epochs and --resume read them",
    )
    parser.add_argument(
        "--cache-top-k",
        type=int,
        default=64,
        help="the target's most likely draft tokens kept per position in the cache",
    )


def _add_evaluation_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--eval-every",
        type=int,
        default=0,
        help="steps between held-out tau measurements, kept as OUT/eval_curve.json and .png "
        "(0 = at the end only)",
    )
    parser.add_argument(
        "--eval-prompts", type=int, default=8, help="held-out prompts for tau (0 = none)"
    )
    parser.add_argument(
        "--eval-prompt-file",
        help="measure tau on this bench prompt file (FastChat JSONL, or .txt cut into "
        "passages) instead of the held-out data, as launch.py bench --prompts FILE "
        "--limit N reads it",
    )
    parser.add_argument(
        "--eval-prompt-chars",
        type=int,
        default=600,
        help="passage length of held-out and .txt prompts (the bench's --prompt-chars)",
    )
    parser.add_argument("--eval-max-new-tokens", type=int, default=BENCH_MAX_NEW_TOKENS)
    parser.add_argument(
        "--eval-tree",
        default=BENCH_TREE,
        metavar="N/D/K",
        help="the fixed tree of the evaluation, as the bench's --total-tokens/--depth/--top-k",
    )
    parser.add_argument(
        "--eval-head",
        metavar="DIR",
        help="only measure this head's tau with the evaluation settings (no training)",
    )
