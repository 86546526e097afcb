"""``python launch.py make-demo``: rebuild the bundled demo pair from offline data, start to end.

    python launch.py make-demo                 # target (if missing), head data, both heads
    python launch.py make-demo --rebuild-target --target-minutes 70

Steps: 1 pretrain the demo target LM (models/training/demo_target.py) unless it exists;
2 chat fine-tune it on its own greedy replies (models/training/chat_finetune.py) unless its
manifest records that already; 3 answer prompts from the same permissive sources with the
final target, greedy and sampled at temperature 1, to make the heads' data; 4 train the
EAGLE-1/2 and EAGLE-3 heads (in parallel processes, one thread each); 5 export both heads in
bfloat16 next to the target in assets/demo/.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import time
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
    "eagle3": ["--epochs", "4", "--lr", "1e-3", "--ttt-steps", "5", "--draft-vocab-size", "2048"],
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--prompts", type=int, default=2000, help="prompts answered greedily")
    parser.add_argument(
        "--sampled-prompts", type=int, default=500,
        help="further prompts answered at temperature 1 (the heads then also learn sampled text)",
    )  # fmt: skip
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


def run(args: argparse.Namespace) -> int:
    target = DEMO / "target"
    work = Path(args.work)
    data_dir = Path(args.data_dir)
    if not data_dir.is_dir():
        raise ConfigError(f"training data folder {data_dir} not found", hint="pass --data-dir")
    if args.rebuild_target or not (target / "config.json").is_file():
        build_target(args.target_minutes)
    if args.finetune_epochs > 0 and "chat_finetune" not in _manifest(target):
        finetune_target(target, data_dir, args, work)
    data = work / "data.jsonl"
    if not data.is_file():
        make_head_data(
            target, data_dir, args.prompts, args.reply_tokens, data, args.sampled_prompts
        )
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


def make_head_data(
    target: Path, data_dir: Path, count: int, reply_tokens: int, out: Path, sampled: int = 0
) -> None:
    """``count`` prompts answered greedily and ``sampled`` further ones at temperature 1."""
    from models.training.demo_heads import answer_prompts, demo_prompts, write_sharegpt

    model, tokenizer = _load_target(target)
    prompts = demo_prompts(data_dir, count + sampled)
    conversations = answer_prompts(
        model, tokenizer, prompts[:count], reply_tokens, progress=_progress("greedy replies")
    )
    if sampled:
        torch.manual_seed(0)
        conversations += answer_prompts(
            model, tokenizer, prompts[count:], reply_tokens, temperature=1.0,
            progress=_progress("sampled replies"),
        )  # fmt: skip
    write_sharegpt(conversations, out)


def finetune_target(target: Path, data_dir: Path, args: argparse.Namespace, work: Path) -> None:
    """Chat fine-tune the pretrained target on its own greedy replies, then swap it in."""
    from models.training.chat_finetune import (
        FinetuneOptions,
        finetune_on_conversations,
        reply_entropy,
    )
    from models.training.data import load_conversations

    replies = work / "finetune-data.jsonl"
    if not replies.is_file():
        make_head_data(target, data_dir, args.finetune_prompts, args.reply_tokens, replies)
    conversations = load_conversations(replies)
    held_out, train = conversations[:64], conversations[64:]
    model, tokenizer = _load_target(target)
    before = reply_entropy(model, tokenizer, held_out)
    options = FinetuneOptions(epochs=args.finetune_epochs)
    started = time.time()
    report = _progress("fine-tune")
    result = finetune_on_conversations(
        model, tokenizer, train, options, progress=lambda step, total, _loss: report(step, total)
    )
    after = reply_entropy(model, tokenizer, held_out)
    logger.info("reply entropy %.2f -> %.2f nats", before, after)
    manifest = _manifest(target)
    manifest["chat_finetune"] = {
        "data": f"{len(train)} prompts from the corpus answered greedily by the pretrained model",
        "options": {"epochs": options.epochs, "lr": options.lr, "batch_size": options.batch_size},
        "steps": result.steps,
        "loss_first_steps": round(result.first_loss, 4),
        "loss_last_steps": round(result.last_loss, 4),
        "held_out_reply_entropy_nats": {"before": round(before, 3), "after": round(after, 3)},
        "seconds": round(time.time() - started, 1),
    }
    tmp = target.with_name(target.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    model.to(torch.bfloat16).save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    shutil.rmtree(target)
    os.replace(tmp, target)


def _manifest(target: Path) -> dict:
    path = target / "manifest.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _load_target(target: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    return model, tokenizer


def _progress(label: str):
    def report(done: int, total: int) -> None:
        end = "\n" if done >= total else ""
        print(f"\r{label} {done}/{total}", end=end, file=sys.stderr, flush=True)

    return report


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
                                                 env={**os.environ, **env})))  # fmt: skip
    failed = [kind for kind, process in processes if process.wait() != 0]
    if failed:
        raise ConfigError(f"head training failed for {', '.join(failed)}; see {work}/<kind>.log")


def export_head(trained: Path, destination: Path) -> None:
    head = load_head(trained).to(torch.bfloat16)
    save_head(head, destination)
    logger.info("exported %s -> %s", trained, destination)
