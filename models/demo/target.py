"""The demo target's build, start to end: corpus -> tokenizer -> packed token streams (kept in
the work folder) -> pretraining (resumable) -> export to ``assets/demo/target/``.

    build_target(TargetBuildConfig())   # what ``python launch.py make-demo-target`` runs

An interrupted build resumes from ``WORK_DIR/ckpt/last.pt`` when run again with the same data;
``fresh`` rebuilds the tokenizer and token streams and restarts training.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.demo.corpus import SOURCE_NAMES, SYSTEM_PROMPT_FRACTION, Document, collect_corpus
from models.demo.export import ExportOptions, build_manifest, export
from models.demo.pretrain import (
    ModelShape,
    PackedWindows,
    TrainOptions,
    TrainRun,
    TrainState,
    build_config,
    build_model,
    load_checkpoint,
    make_optimizer,
    train,
)
from models.demo.tokenizer import (
    SPECIAL_TOKENS,
    load_tokenizer,
    render,
    sample_texts,
    tokenize_docs,
    train_tokenizer,
)

logger = logging.getLogger(__name__)
PACKAGE_LOGGER = "models.demo"  # every step of the build logs under it (train.log)

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DATA_DIR = REPO_ROOT.parent / "shared" / "data"
DEFAULT_BENCH_DIR = REPO_ROOT.parent / "shared" / "bench"
DEFAULT_WORK_DIR = REPO_ROOT / "work" / "demo-build"
DEFAULT_OUT_DIR = REPO_ROOT / "assets" / "demo" / "target"
DEFAULT_MINUTES = 70.0  # training budget when no step count is given


@dataclass
class DataOptions:
    """Where the text comes from and how the tokenizer is learnt."""

    data_dir: Path = DEFAULT_DATA_DIR
    bench_dir: Path | None = DEFAULT_BENCH_DIR  # prompts removed from training; None = keep all
    sources: tuple[str, ...] = tuple(SOURCE_NAMES)
    max_docs_per_source: int | None = None
    val_fraction: float = 0.02
    vocab_size: int = 4096
    tokenizer_chars: int = 8_000_000  # training text used to learn the BPE merges


@dataclass
class TargetBuildConfig:
    """One run of the target build; ``train.seed`` seeds the corpus split and the model too."""

    work_dir: Path = DEFAULT_WORK_DIR  # tokenizer, token streams, checkpoints, train.log
    out_dir: Path = DEFAULT_OUT_DIR
    log_file: Path | None = None  # None = WORK_DIR/train.log
    data: DataOptions = field(default_factory=DataOptions)
    shape: ModelShape = field(default_factory=ModelShape)
    train: TrainOptions = field(
        default_factory=lambda: TrainOptions(budget_seconds=DEFAULT_MINUTES * 60)
    )
    fresh: bool = False  # ignore the checkpoint, rebuild tokenizer and token streams
    export_only: bool = False  # export the last checkpoint and stop
    export: bool = True  # export when the schedule ends
    export_dtype: str = "bfloat16"
    threads: int = 1  # CPU threads for torch
    device: str = "cpu"  # chosen by the front end (the backend's device chooser)

    @property
    def ckpt_path(self) -> Path:
        return self.work_dir / "ckpt" / "last.pt"


def build_target(config: TargetBuildConfig) -> int:
    """Build (or resume, or only export) the demo target; every step logs to train.log."""
    handler = _log_to_file(config.log_file or config.work_dir / "train.log")
    try:
        return _build(config)
    except Exception:
        logger.exception("demo target build failed")
        raise
    finally:
        logging.getLogger(PACKAGE_LOGGER).removeHandler(handler)
        handler.close()


def _log_to_file(log_file: Path) -> logging.Handler:
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
    package = logging.getLogger(PACKAGE_LOGGER)
    package.setLevel(logging.INFO)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(log_file, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    package.addHandler(handler)
    return handler


def _build(config: TargetBuildConfig) -> int:
    os.environ.setdefault("RAYON_NUM_THREADS", str(max(1, config.threads)))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(max(1, config.threads))
    work = config.work_dir
    if config.export_only:
        return _export_last(config)
    if config.fresh and config.ckpt_path.exists():
        config.ckpt_path.unlink()
    device = torch.device(config.device)
    logger.info(
        "device %s, %d torch thread(s), work folder %s", device, torch.get_num_threads(), work
    )
    summary = prepare_data(config)
    state, opts = _train_target(config, summary, device)
    if not state.finished:
        logger.info(
            "stopped at step %d before the end of the schedule; rerun to resume "
            "(or --export-only to export this checkpoint)",
            state.step,
        )
        return 0
    if config.export:
        _export(config, ExportOptions(config.export_dtype, opts.eval_windows, opts.seq_len))
    return 0


def _export_last(config: TargetBuildConfig) -> int:
    """Export the last checkpoint as it is (``export_only``), at its trained context."""
    if not config.ckpt_path.exists():
        raise FileNotFoundError(f"no checkpoint at {config.ckpt_path}")
    seq_len = load_checkpoint(config.ckpt_path)["options"]["seq_len"]
    _export(config, ExportOptions(config.export_dtype, config.train.eval_windows, seq_len))
    return 0


def _export(config: TargetBuildConfig, options: ExportOptions) -> None:
    work = config.work_dir
    summary = json.loads((work / "data" / "corpus.json").read_text(encoding="utf-8"))
    manifest = build_manifest(summary, load_checkpoint(config.ckpt_path))
    val = np.load(work / "data" / "val.npy")
    export(config.ckpt_path, work / "tokenizer", config.out_dir, manifest, val, options)


def _train_target(
    config: TargetBuildConfig, summary: dict[str, Any], device: torch.device
) -> tuple[TrainState, TrainOptions]:
    """Build the model (or resume it from the checkpoint) and train it on the token streams."""
    work, opts = config.work_dir, TrainOptions(**asdict(config.train))
    seed = opts.seed  # the model's initialisation, before a resume restores the data seed
    shape, state, ckpt = _resume_point(config, summary, opts)
    model_config = build_config(shape, load_tokenizer(work / "tokenizer"))
    model = build_model(model_config, seed)
    optimizer = make_optimizer(model, opts)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        model.to(device)
        optimizer.load_state_dict(ckpt["optimizer"])
    n_params = sum(p.numel() for p in model.parameters())
    logger.info(
        "model: LlamaForCausalLM %s, %.2fM parameters, vocab %d",
        asdict(shape),
        n_params / 1e6,
        model_config.vocab_size,
    )
    data, val = _windows(work, opts)
    extra = {
        "model_config": model_config.to_dict(),
        "shape": asdict(shape),
        "options": asdict(opts),
        "train_sha256": summary["train_sha256"],
        "device": str(device),
        "threads": torch.get_num_threads(),
    }
    run = TrainRun(model, optimizer, data, val, device, config.ckpt_path, extra)
    return train(run, state, opts), opts


def _resume_point(
    config: TargetBuildConfig, summary: dict[str, Any], opts: TrainOptions
) -> tuple[ModelShape, TrainState, dict[str, Any] | None]:
    """The shape, state and checkpoint to continue from; ``opts`` takes the checkpoint's data
    position settings. A fresh start without a checkpoint."""
    shape, path = config.shape, config.ckpt_path
    if not path.exists():
        return shape, TrainState(), None
    ckpt = load_checkpoint(path)
    if ckpt.get("train_sha256") != summary["train_sha256"]:
        raise RuntimeError(f"{path} was trained on other token data; use --fresh")
    if ckpt["shape"] != asdict(shape):
        logger.warning(
            "resuming with the checkpoint's shape %s (ignoring %s)", ckpt["shape"], asdict(shape)
        )
    for key in ("seq_len", "batch_size", "seed"):
        setattr(opts, key, ckpt["options"][key])  # the data position depends on these
    state = TrainState(**ckpt["state"])
    logger.info(
        "resuming from %s: step %d, epoch %d, batch %d, %.2fM tokens, %.1f min",
        path,
        state.step,
        state.epoch,
        state.index,
        state.tokens_seen / 1e6,
        state.train_seconds / 60,
    )
    return ModelShape(**ckpt["shape"]), state, ckpt


def _windows(work: Path, opts: TrainOptions) -> tuple[PackedWindows, PackedWindows | None]:
    """The training windows and, when the held-out stream is long enough, the held-out ones."""
    train_tokens = np.load(work / "data" / "train.npy")
    val_tokens = np.load(work / "data" / "val.npy")
    data = PackedWindows(train_tokens, opts.seq_len, opts.batch_size, opts.seed)
    val = (
        PackedWindows(val_tokens, opts.seq_len, 1, opts.seed)
        if len(val_tokens) > opts.seq_len + 1
        else None
    )
    schedule = f"{opts.steps} steps" if opts.steps else f"{opts.budget_seconds / 60:g} minutes"
    logger.info(
        "schedule: %s; %d windows of %d, batch %d (%d tokens/step), %d steps/epoch",
        schedule,
        data.num_windows,
        opts.seq_len,
        opts.batch_size,
        opts.batch_size * opts.seq_len,
        data.batches_per_epoch,
    )
    return data, val


# ---- data: corpus -> tokenizer -> token streams -----------------------------------------------


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def prepare_data(config: TargetBuildConfig) -> dict[str, Any]:
    """Build (or reuse) tokenizer + token streams in the work folder; returns the data summary."""
    work, data = config.work_dir, config.data
    tok_dir, data_dir = work / "tokenizer", work / "data"
    summary_path = data_dir / "corpus.json"
    if summary_path.exists() and not config.fresh:
        logger.info("reusing tokenizer and token streams in %s", work)
        return json.loads(summary_path.read_text(encoding="utf-8"))
    for d in (tok_dir, data_dir):
        if d.exists():
            shutil.rmtree(d)
    t0 = time.monotonic()
    unknown = sorted(set(data.sources) - set(SOURCE_NAMES))
    if unknown:
        raise ValueError(f"unknown sources {unknown}; known: {SOURCE_NAMES}")
    corpus = collect_corpus(
        Path(data.data_dir),
        list(data.sources),
        val_fraction=data.val_fraction,
        seed=config.train.seed,
        max_docs_per_source=data.max_docs_per_source,
        bench_dir=data.bench_dir,
    )
    # BPE merges from an evenly spread sample of the (unrepeated) training text.
    texts = sample_texts(corpus.train, data.tokenizer_chars)
    tokenizer = train_tokenizer(texts, data.vocab_size, tok_dir, config.shape.max_positions)
    logger.info("tokenizer: %d tokens, trained in %.0f s", len(tokenizer), time.monotonic() - t0)
    train_tokens = tokenize_docs(corpus.train, tokenizer)
    val_tokens = tokenize_docs(corpus.val, tokenizer)
    data_dir.mkdir(parents=True, exist_ok=True)
    np.save(data_dir / "train.npy", train_tokens)
    np.save(data_dir / "val.npy", val_tokens)
    _count_source_tokens(corpus.train, corpus.val, corpus.stats, tokenizer)
    summary = {
        "data_dir": str(data.data_dir),
        "sources": corpus.stats,
        "train_docs": len(corpus.train),
        "val_docs": len(corpus.val),
        "train_tokens": int(len(train_tokens)),
        "val_tokens": int(len(val_tokens)),
        "chars_per_token": round(
            sum(len(render(d, tokenizer)) for d in corpus.train) / max(1, len(train_tokens)), 3
        ),
        "train_sha256": _sha256(data_dir / "train.npy"),
        "seed": config.train.seed,
        "val_fraction": data.val_fraction,
        "system_prompt_fraction": SYSTEM_PROMPT_FRACTION,
        "tokenizer": {
            "kind": "byte-level BPE, digits split",
            "vocab_size": len(tokenizer),
            "special_tokens": SPECIAL_TOKENS,
            "trained_on_chars": data.tokenizer_chars,
        },
    }
    summary_path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    _log_summary(summary, time.monotonic() - t0)
    return summary


def _count_source_tokens(
    train: list[Document], val: list[Document], stats: dict[str, dict[str, Any]], tokenizer: Any
) -> None:
    """Per-source token counts into ``stats`` (training copies included)."""
    per_source: dict[str, list[Document]] = {}
    for d in train:
        per_source.setdefault(d.source, []).append(d)
    for name, docs in per_source.items():
        stats[name]["train_tokens"] = int(len(tokenize_docs(docs, tokenizer)))
    for name in stats:
        docs = [d for d in val if d.source == name]
        stats[name]["val_tokens"] = int(len(tokenize_docs(docs, tokenizer))) if docs else 0


def _log_summary(summary: dict[str, Any], seconds: float) -> None:
    logger.info(
        "corpus: %d train docs = %d tokens (%.2f chars/token), %d held-out docs = %d "
        "tokens; built in %.0f s",
        summary["train_docs"],
        summary["train_tokens"],
        summary["chars_per_token"],
        summary["val_docs"],
        summary["val_tokens"],
        seconds,
    )
    for name, st in summary["sources"].items():
        logger.info(
            "  %-14s %-34s train %8d tok  val %6d tok",
            name,
            st["licence"],
            st.get("train_tokens", 0),
            st.get("val_tokens", 0),
        )
