"""``python launch.py make-demo``: rebuild the bundled demo pair from offline data, start to end.

    python launch.py make-demo                 # target (if missing), head data, both heads
    python launch.py make-demo --rebuild-target --target-minutes 70

Steps: 1 train the demo target LM (models/training/demo_target.py) unless it exists; 2 answer
prompts from the same permissive sources with that target (greedy) to make the heads' data;
3 train the EAGLE-1/2 and EAGLE-3 heads (in parallel processes, one thread each);
4 export both heads in bfloat16 next to the target in assets/demo/.
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
from pathlib import Path

import torch

from backend.errors import ConfigError
from models.checkpoints import load_head, save_head

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "assets" / "demo"
WORK = ROOT / "work" / "demo-heads"
HEAD_SETTINGS = {
    # kind: extra train-head flags
    "eagle1": ["--epochs", "4", "--lr", "1e-3"],
    "eagle3": ["--epochs", "3", "--lr", "1e-3", "--ttt-steps", "5", "--draft-vocab-size", "2048"],
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--prompts", type=int, default=1500, help="prompts answered by the target")
    parser.add_argument("--reply-tokens", type=int, default=128, help="max tokens per reply")
    parser.add_argument("--rebuild-target", action="store_true")
    parser.add_argument("--target-minutes", type=float, default=70.0)
    parser.add_argument("--kinds", default="eagle1,eagle3")
    parser.add_argument("--resume", action="store_true", help="continue interrupted head runs")
    parser.add_argument("--work", default=str(WORK), help="folder for data, runs and logs")


def run(args: argparse.Namespace) -> int:
    target = DEMO / "target"
    if args.rebuild_target or not (target / "config.json").is_file():
        build_target(args.target_minutes)
    work = Path(args.work)
    data = work / "data.jsonl"
    if not data.is_file():
        make_head_data(target, Path(args.data_dir), args.prompts, args.reply_tokens, data)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = [k for k in kinds if k not in HEAD_SETTINGS]
    if unknown:
        raise ConfigError(f"unknown head kinds: {', '.join(unknown)}")
    train_heads(target, data, kinds, args.resume, work)
    for kind in kinds:
        export_head(work / kind, DEMO / f"head-{kind}")
    print(f"demo pair ready in {DEMO}")
    return 0


def build_target(minutes: float) -> None:
    from models.training import demo_target

    parser = argparse.ArgumentParser()
    demo_target.add_arguments(parser)
    args = parser.parse_args(["--minutes", str(minutes)])
    if demo_target.run(args) != 0:
        raise ConfigError("building the demo target failed; see work/demo-build/train.log")


def make_head_data(target: Path, data_dir: Path, count: int, reply_tokens: int, out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from models.training.demo_heads import answer_prompts, demo_prompts, write_sharegpt

    if not data_dir.is_dir():
        raise ConfigError(f"training data folder {data_dir} not found", hint="pass --data-dir")
    prompts = demo_prompts(data_dir, count)
    tokenizer = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()

    def progress(done: int, total: int) -> None:
        print(f"\ranswering prompts {done}/{total}", end="", file=sys.stderr, flush=True)

    conversations = answer_prompts(model, tokenizer, prompts, reply_tokens, progress=progress)
    print(file=sys.stderr)
    write_sharegpt(conversations, out)


def train_heads(target: Path, data: Path, kinds: list[str], resume: bool, work: Path) -> None:
    """One train-head process per kind, side by side, one thread each."""
    processes = []
    for kind in kinds:
        command = [
            sys.executable, str(ROOT / "launch.py"), "train-head", "--target", str(target),
            "--data", str(data), "--kind", kind, "--out", str(work / kind), "--batch-size", "8",
            "--max-length", "512", "--eval-prompts", "16", "--checkpoint-every", "100",
            *HEAD_SETTINGS[kind], *(["--resume"] if resume else []),
        ]  # fmt: skip
        log = (work / f"{kind}.log").open("w")
        env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        processes.append((kind, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                 env={**_environ(), **env})))  # fmt: skip
    failed = [kind for kind, process in processes if process.wait() != 0]
    if failed:
        raise ConfigError(f"head training failed for {', '.join(failed)}; see {work}/<kind>.log")


def export_head(trained: Path, destination: Path) -> None:
    head = load_head(trained).to(torch.bfloat16)
    save_head(head, destination)
    logger.info("exported %s -> %s", trained, destination)


def _environ() -> dict[str, str]:
    import os

    return dict(os.environ)
