"""The demo pair's whole build, start to end (what ``python launch.py make-demo`` runs):

1 pretrain the demo target LM (target.py) unless it exists; 2 chat fine-tune it on its own
greedy replies (chat_finetune.py) unless its manifest records that already; 3 answer prompts
from the same permissive sources with the final target, greedy and sampled at temperature 1, to
make the heads' data (heads.py); 4 train the EAGLE-1/2 and EAGLE-3 heads (in parallel
``launch.py train-head`` processes, one thread each); 5 export both heads in bfloat16 next to
the target in assets/demo/.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from models.checkpoints import load_head, save_head
from models.demo.pretrain import TrainOptions
from models.demo.target import DEFAULT_DATA_DIR, TargetBuildConfig, build_target
from models.errors import ConfigError

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "assets" / "demo"
WORK = ROOT / "work" / "demo-heads"
HEAD_SETTINGS = {
    # kind: extra train-head flags
    "eagle1": ["--epochs", "4", "--lr", "1e-3"],
    "eagle3": ["--epochs", "4", "--lr", "1e-3", "--ttt-steps", "5", "--draft-vocab-size", "2048"],
}
HELD_OUT_CONVERSATIONS = 64  # fine-tune replies kept aside to measure the reply entropy


@dataclass(frozen=True)
class DemoBuildConfig:
    data_dir: Path = DEFAULT_DATA_DIR
    work: Path = WORK  # data, head runs and logs
    prompts: int = 2000  # answered greedily for the heads' data
    sampled_prompts: int = 500  # further ones answered at temperature 1
    finetune_prompts: int = 1500
    finetune_epochs: int = 3  # 0 = skip the chat fine-tune
    reply_tokens: int = 128  # max tokens per reply
    rebuild_target: bool = False
    target_minutes: float = 70.0
    kinds: tuple[str, ...] = ("eagle1", "eagle3")
    resume: bool = False  # continue interrupted head runs
    device: str = "cpu"  # of the target's pretraining; chosen by the front end


def build_demo(config: DemoBuildConfig) -> Path:
    """Build whatever of the demo pair is missing; returns the folder that holds it."""
    target = DEMO / "target"
    if config.rebuild_target or not (target / "config.json").is_file():
        minutes = config.target_minutes
        train = TrainOptions(budget_seconds=minutes * 60)
        build_target(TargetBuildConfig(train=train, device=config.device))
    if config.finetune_epochs > 0 and "chat_finetune" not in _manifest(target):
        finetune_target(target, config)
    data = config.work / "data.jsonl"
    if not data.is_file():
        counts = (config.prompts, config.sampled_prompts)
        make_head_data(target, config.data_dir, counts, config.reply_tokens, data)
    train_heads(target, data, list(config.kinds), config.resume, config.work)
    for kind in config.kinds:
        export_head(config.work / kind, DEMO / f"head-{kind}")
    return DEMO


def make_head_data(
    target: Path, data_dir: Path, counts: tuple[int, int], reply_tokens: int, out: Path
) -> None:
    """``counts`` = (greedy, sampled): prompts answered greedily and further ones at
    temperature 1."""
    from models.demo.heads import ReplyOptions, answer_prompts, demo_prompts, write_sharegpt

    count, sampled = counts
    model, tokenizer = _load_target(target)
    prompts = demo_prompts(data_dir, count + sampled)
    greedy = ReplyOptions(max_new_tokens=reply_tokens)
    conversations = answer_prompts(
        model, tokenizer, prompts[:count], greedy, progress=_progress("greedy replies")
    )
    if sampled:
        torch.manual_seed(0)
        at_one = ReplyOptions(max_new_tokens=reply_tokens, temperature=1.0)
        conversations += answer_prompts(
            model, tokenizer, prompts[count:], at_one, progress=_progress("sampled replies")
        )
    write_sharegpt(conversations, out)


def finetune_target(target: Path, config: DemoBuildConfig) -> None:
    """Chat fine-tune the pretrained target on its own greedy replies, then swap it in."""
    from models.demo.chat_finetune import FinetuneOptions, finetune_on_conversations, reply_entropy
    from models.training.data import load_conversations

    replies = config.work / "finetune-data.jsonl"
    if not replies.is_file():
        counts = (config.finetune_prompts, 0)
        make_head_data(target, config.data_dir, counts, config.reply_tokens, replies)
    conversations = load_conversations(replies)
    held_out = conversations[:HELD_OUT_CONVERSATIONS]
    train = conversations[HELD_OUT_CONVERSATIONS:]
    model, tokenizer = _load_target(target)
    before = reply_entropy(model, tokenizer, held_out)
    options = FinetuneOptions(epochs=config.finetune_epochs)
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
    _replace_target(target, model.to(torch.bfloat16), tokenizer, manifest)


def _replace_target(target: Path, model, tokenizer, manifest: dict) -> None:
    """Write the model next to ``target`` first, then swap it in, so a crash loses nothing."""
    tmp = target.with_name(target.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(str(tmp))
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


def _progress(label: str) -> Callable[[int, int], None]:
    def report(done: int, total: int) -> None:
        end = "\n" if done >= total else ""
        print(f"\r{label} {done}/{total}", end=end, file=sys.stderr, flush=True)

    return report


def train_heads(target: Path, data: Path, kinds: list[str], resume: bool, work: Path) -> None:
    """One train-head process per kind, side by side, one thread each."""
    processes = []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    for kind in kinds:
        log = (work / f"{kind}.log").open("w")
        command = _train_head_command(target, data, kind, resume, work)
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        processes.append((kind, process))
    failed = [kind for kind, process in processes if process.wait() != 0]
    if failed:
        raise ConfigError(f"head training failed for {', '.join(failed)}; see {work}/<kind>.log")


def _train_head_command(target: Path, data: Path, kind: str, resume: bool, work: Path) -> list:
    return [
        *(sys.executable, str(ROOT / "launch.py"), "train-head"),
        *("--target", str(target), "--data", str(data), "--kind", kind),
        *("--out", str(work / kind), "--batch-size", "8", "--max-length", "512"),
        *("--eval-prompts", "16", "--checkpoint-every", "100"),
        *HEAD_SETTINGS[kind],
        *(["--resume"] if resume else []),
    ]


def export_head(trained: Path, destination: Path) -> None:
    head = load_head(trained).to(torch.bfloat16)
    save_head(head, destination)
    logger.info("exported %s -> %s", trained, destination)
