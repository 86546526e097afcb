"""``python launch.py make-demo``: rebuild the bundled demo pair from offline data, start to end.

    python launch.py make-demo                 # target (if missing), head data, both heads
    python launch.py make-demo --rebuild-target --target-minutes 70

The steps are models/demo/build.py's; this front end reads the flags and checks them first.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from backend.engine.device import choose_device
from backend.errors import ConfigError
from models.demo.build import HEAD_SETTINGS, WORK, DemoBuildConfig, build_demo
from models.demo.target import DEFAULT_DATA_DIR


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR))
    parser.add_argument("--prompts", type=int, default=2000, help="prompts answered greedily")
    parser.add_argument(
        "--sampled-prompts",
        type=int,
        default=500,
        help="further prompts answered at temperature 1 (the heads then also learn sampled text)",
    )
    parser.add_argument("--finetune-prompts", type=int, default=1500)
    parser.add_argument(
        "--finetune-epochs", type=int, default=3, help="0 = skip the chat fine-tune"
    )
    parser.add_argument("--reply-tokens", type=int, default=128, help="max tokens per reply")
    parser.add_argument("--rebuild-target", action="store_true")
    parser.add_argument("--target-minutes", type=float, default=70.0)
    parser.add_argument("--kinds", default="eagle1,eagle3")
    parser.add_argument("--resume", action="store_true", help="continue interrupted head runs")
    parser.add_argument("--work", default=str(WORK), help="folder for data, runs and logs")


def build_config(args: argparse.Namespace) -> DemoBuildConfig:
    """The build's settings from the flags; bad ones fail here, before hours of work."""
    data_dir = Path(args.data_dir)
    if not data_dir.is_dir():
        raise ConfigError(f"training data folder {data_dir} not found", hint="pass --data-dir")
    kinds = tuple(k for k in args.kinds.split(",") if k)
    unknown = [k for k in kinds if k not in HEAD_SETTINGS]
    if unknown:
        raise ConfigError(f"unknown head kinds: {', '.join(unknown)}")
    return DemoBuildConfig(
        data_dir=data_dir,
        work=Path(args.work),
        prompts=args.prompts,
        sampled_prompts=args.sampled_prompts,
        finetune_prompts=args.finetune_prompts,
        finetune_epochs=args.finetune_epochs,
        reply_tokens=args.reply_tokens,
        rebuild_target=args.rebuild_target,
        target_minutes=args.target_minutes,
        kinds=kinds,
        resume=args.resume,
        device=str(choose_device()),
    )


def run(args: argparse.Namespace) -> int:
    demo = build_demo(build_config(args))
    print(f"demo pair ready in {demo}")
    return 0
