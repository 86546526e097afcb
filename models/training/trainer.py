"""Train an EAGLE-1/2 or EAGLE-3 draft head against a frozen transformers target.

    result = train_head(target, tokenizer, examples, TrainConfig(kind="eagle3", out_dir="out"))
    # interrupted? the same call with resume=True continues from out/checkpoint-<step>/

Per step: the target runs once under no_grad on a padded batch (features captured by hooks,
targets kept), or with ``cache_dir`` its outputs are read from a feature cache that a first pass
filled (feature_cache.py); then the head's loss (losses.py) is minimised with AdamW on the
head's own parameters; the embedding (and for EAGLE-1 the lm_head) are the target's, borrowed
and frozen. Checkpoints (checkpointing.py) hold the head in the official format and everything a
resume restores. The data order is a pure function of (seed, step), so the step alone is the
data position. Tau on held-out prompts comes from an injected ``evaluate`` callback (the engine
lives in backend/, which models/ must not import); with ``eval_every`` its values form a curve
kept beside the head (eval_curve.py).
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from models.checkpoints import save_head
from models.errors import ConfigError
from models.features import decoder_of
from models.heads.base import DraftHead
from models.heads.config import HeadKind
from models.training.checkpointing import checkpoint_dirs, restore_checkpoint, save_checkpoint
from models.training.data import TokenizedExample, batch_indices
from models.training.eval_curve import CurvePoint, write_curve
from models.training.fc_scaling import feature_scale, plain_head, scale_fc_inputs
from models.training.feature_cache import CacheSettings, FeatureCache
from models.training.head_init import build_head_for_target
from models.training.losses import (
    BatchSpec,
    LossOutput,
    TargetBatch,
    eagle1_loss,
    eagle3_loss,
    pad_id_of,
    target_batch,
)

logger = logging.getLogger(__name__)

BatchSource = Callable[[list[int]], TargetBatch]  # example indices -> the step's batch


@dataclass(slots=True)
class TrainConfig:
    """Head-training settings; the defaults follow the reference where it has one."""

    kind: HeadKind | str  # eagle1 (EAGLE-1/2) or eagle3
    out_dir: str | Path  # final head here, checkpoints in out_dir/checkpoint-<step>/
    steps: int = 0  # optimizer steps; 0 = derive from epochs
    epochs: float = 1.0  # passes over the examples when steps == 0
    batch_size: int = 4  # sequences per step (right-padded)
    lr: float = 3e-4  # peak AdamW learning rate (1e-4 .. 1e-3 typical)
    weight_decay: float = 0.0
    warmup_steps: int | None = None  # linear warm-up; None = 5% of steps
    min_lr_ratio: float = 0.1  # cosine decays to lr * this
    grad_clip: float = 0.5  # max grad norm (reference: 0.5); 0 = off
    noise: float = 0.2  # EAGLE-1 input-feature noise width: uniform in +-noise/2
    draft_vocab_size: int | None = None  # EAGLE-3 reduced vocab Vd; None = full vocab
    ttt_steps: int = 7  # EAGLE-3 training-time-test unroll depth
    # EAGLE-3 with a draft vocabulary: compute the target's logits on it only. Positions whose
    # target argmax lies outside it then train toward the best in-vocabulary token instead of
    # being skipped; much cheaper for large vocabularies.
    draft_readout_only: bool = False
    intermediate_size: int | None = None  # head MLP width; None = the target's
    init_from_target: bool = True  # EAGLE-3: start lm_head/norm from the target's rows
    max_length: int = 2048  # tokens per sequence (longer ones are cut)
    checkpoint_every: int = 500  # steps; 0 = only the final head
    keep_checkpoints: int = 2  # newest checkpoints kept on disk
    eval_every: int = 0  # steps between tau evaluations; 0 = only at the end
    log_every: int = 10
    seed: int = 0
    device: str | None = None  # None = where the target is; "cuda:0", "cpu", ...
    resume: bool = False  # continue from the newest checkpoint in out_dir
    show_progress: bool = True  # tqdm bar on stderr
    # Keep the target's features and targets here: it then runs once per token, however many
    # epochs; None = run it for every batch.
    cache_dir: str | Path | None = None
    cache_top_k: int = 64  # the target's most likely draft-vocabulary tokens kept per position
    # What the caller knows about the data (files, regeneration, held-out split): recorded
    # with the head in training_summary.json and eval_curve.json.
    about: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        try:
            self.kind = HeadKind(self.kind)
        except ValueError as err:
            raise ConfigError(f"head kind must be eagle1 or eagle3, got {self.kind!r}") from err
        self.out_dir = Path(self.out_dir)
        positive = {
            "batch_size": self.batch_size,
            "lr": self.lr,
            "ttt_steps": self.ttt_steps,
            "max_length": self.max_length,
            "cache_top_k": self.cache_top_k,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ConfigError(f"{name} must be > 0, got {value}")
        if self.steps < 0 or (self.steps == 0 and self.epochs <= 0):
            raise ConfigError("give a positive number of steps or epochs")
        if self.draft_vocab_size is not None and self.kind is not HeadKind.EAGLE3:
            raise ConfigError("a reduced draft vocabulary exists only for EAGLE-3 heads")


@dataclass(frozen=True, slots=True)
class TrainProgress:
    step: int  # optimizer steps done
    total_steps: int
    loss: float
    accuracy: float  # teacher-forced top-1 agreement at draft depth 1
    estimated_tau: float  # 1 + a1 + a1*a2 + ... from teacher-forced agreements
    lr: float
    tau: float | None = None  # measured on held-out prompts, when evaluated at this step


@dataclass(slots=True)
class TrainResult:
    head: DraftHead
    out_dir: Path
    steps: int
    losses: list[float] = field(default_factory=list)  # per step, including resumed history
    accuracies: list[float] = field(default_factory=list)  # last step's per-depth agreement
    estimated_tau: float = 1.0
    tau: float | None = None  # final held-out tau (None without an evaluate callback)
    resumed_from: int | None = None
    curve: list[CurvePoint] = field(default_factory=list)  # held-out tau along the run
    timing: StepTiming = field(default_factory=lambda: StepTiming())

    @property
    def final_loss(self) -> float:
        return self.losses[-1] if self.losses else float("nan")


@dataclass(slots=True)
class StepTiming:
    """Where this call's steps spent their time (a resumed run's earlier steps not included)."""

    batches_from: str = "target"  # "target": a forward per step; "cache": read from disk
    batch_s: float = 0.0  # target forwards, or cache reads
    head_s: float = 0.0  # the head's loss (its TTT unroll), backward and optimizer step
    tokens: int = 0  # real (unpadded) tokens in the steps' batches
    steps: int = 0
    cache_fill_s: float = 0.0  # the target's one pass that filled the cache (0: found filled)

    def tokens_per_s(self) -> float:
        seconds = self.batch_s + self.head_s
        return self.tokens / seconds if seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "tokens_per_s": round(self.tokens_per_s(), 2)}


# ---- schedule ---------------------------------------------------------------------------------


def warmup_cosine(total: int, warmup: int, min_ratio: float) -> Callable[[int], float]:
    """LR factor per step (for LambdaLR): linear warm-up, then cosine down to ``min_ratio``."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    return factor


# ---- the loop ---------------------------------------------------------------------------------


def train_head(
    target: nn.Module,
    tokenizer,
    examples: Sequence[TokenizedExample],
    config: TrainConfig,
    progress_callback: Callable[[TrainProgress], None] | None = None,
    evaluate: Callable[[DraftHead], float] | None = None,
) -> TrainResult:
    """Train a head on ``examples``; ``evaluate(head) -> tau`` runs every ``eval_every`` steps
    and at the end. Returns the trained head (also written to ``config.out_dir``)."""
    if not examples:
        raise ConfigError("no training examples")
    out_dir = Path(config.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    existing = checkpoint_dirs(out_dir)
    if existing and not config.resume:
        raise ConfigError(
            f"{out_dir} already holds training checkpoints",
            hint="resume them (--resume) or choose another output directory",
        )
    run = _start(target, tokenizer, examples, config)
    run.progress_callback, run.evaluate = progress_callback, evaluate
    if config.resume and existing:
        _resume(run, existing[-1][1])
    elif config.resume:
        logger.info("no checkpoint in %s: starting from step 0", out_dir)
    run.bar = _progress_bar(config, run.total, run.result.steps)
    try:
        _train_steps(run)
    finally:
        if run.bar is not None:
            run.bar.close()
    result = run.result
    head = result.head = plain_head(run.head)  # the official format from here on
    save_head(head, out_dir)
    if evaluate is not None and result.tau is None:  # no step ran: a finished run resumed
        result.tau = _evaluate(head, evaluate)
        if not result.curve or result.curve[-1].step != result.steps:
            run.add_point(result.tau, result.estimated_tau)
    if result.curve:
        write_curve(out_dir, result.curve, _curve_about(config))
    _write_summary(out_dir, config, result)
    return result


@dataclass(slots=True)
class _Run:
    """One ``train_head`` call's moving parts, from the first step to the last."""

    config: TrainConfig
    examples: Sequence[TokenizedExample]
    head: DraftHead
    source: BatchSource
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    noise_rng: torch.Generator
    result: TrainResult
    total: int
    tokens_seen: int = 0  # real tokens of every step so far, resumed ones included
    bar: Any = None
    progress_callback: Callable[[TrainProgress], None] | None = None
    evaluate: Callable[[DraftHead], float] | None = None

    def save_checkpoint(self) -> None:
        """A checkpoint at the current step: the head plus everything a resume restores."""
        state = {
            "step": self.result.steps,
            "total_steps": self.total,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "noise_rng": self.noise_rng.get_state(),
            "torch_rng": torch.get_rng_state(),
            "losses": list(self.result.losses),
            "tokens_seen": self.tokens_seen,
            "curve": [asdict(point) for point in self.result.curve],
        }
        out_dir, keep = Path(self.config.out_dir), self.config.keep_checkpoints
        save_checkpoint(out_dir, self.result.steps, self.head, state, keep)

    def add_point(self, tau: float, estimated_tau: float) -> None:
        """A point of the held-out curve at the current step (loss: the mean since the last)."""
        result = self.result
        since = result.curve[-1].step if result.curve else 0
        window = result.losses[since:] or result.losses[-1:]
        loss = sum(window) / len(window) if window else float("nan")
        point = CurvePoint(result.steps, self.tokens_seen, tau, loss, estimated_tau)
        result.curve.append(point)
        write_curve(self.config.out_dir, result.curve, _curve_about(self.config))


def _start(
    target: nn.Module, tokenizer, examples: Sequence[TokenizedExample], config: TrainConfig
) -> _Run:
    """The frozen target on its device, a fresh head for it, where batches come from (the
    target, or its feature cache, filled first), the optimizer and the schedule."""
    device = (
        torch.device(config.device)
        if config.device
        else target.get_input_embeddings().weight.device
    )
    if config.device and not getattr(target, "hf_device_map", None):
        target.to(device)
    target.eval().requires_grad_(False)
    head = build_head_for_target(target, tokenizer, examples, config).to(device).train()
    spec = _batch_spec(target, tokenizer, head, config, device)
    result = TrainResult(head=head, out_dir=Path(config.out_dir), steps=0)
    source = _batch_source(target, examples, spec, config, result.timing)
    if head.kind is HeadKind.EAGLE3:
        sample = source(batch_indices(len(examples), config.batch_size, 0, config.seed))
        scale_fc_inputs(head, feature_scale(sample.features, sample.loss_mask))
    total = config.steps or math.ceil(config.epochs * len(examples) / config.batch_size)
    warmup = config.warmup_steps if config.warmup_steps is not None else max(1, total // 20)
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params, lr=config.lr, betas=(0.9, 0.95), weight_decay=config.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, warmup_cosine(total, warmup, config.min_lr_ratio)
    )
    noise_rng = torch.Generator(device=device).manual_seed(config.seed)
    return _Run(config, examples, head, source, optimizer, scheduler, noise_rng, result, total)


def _batch_spec(
    target: nn.Module, tokenizer, head: DraftHead, config: TrainConfig, device: torch.device
) -> BatchSpec:
    """What each batch asks of the target: the head's features, and its columns."""
    feature_layers = head.feature_layers(len(decoder_of(target).layers))
    columns = None
    if head.config.has_reduced_vocab:
        draft_ids = torch.arange(head.config.draft_vocab_size, device=head.d2t.device)
        columns = head.to_target_ids(draft_ids).to(device)
    return BatchSpec(
        feature_layers,
        pad_id_of(tokenizer),
        config.max_length,
        device,
        columns=columns,
        readout_only=config.draft_readout_only and columns is not None,
    )


def _batch_source(
    target: nn.Module,
    examples: Sequence[TokenizedExample],
    spec: BatchSpec,
    config: TrainConfig,
    timing: StepTiming,
) -> BatchSource:
    """Batches from the target itself, or from the feature cache (filled here where needed)."""
    if config.cache_dir is None:
        return lambda picked: target_batch(target, [examples[i] for i in picked], spec)
    settings = CacheSettings(config.cache_dir, config.cache_top_k, config.batch_size)
    cache = FeatureCache.open_or_fill(settings, target, examples, spec, _announcer(config))
    timing.batches_from, timing.cache_fill_s = "cache", cache.fill_s
    logger.info(
        "feature cache %s: the kept entries hold %.1f%% of the target's probability",
        config.cache_dir,
        100 * cache.kept_mass,
    )
    return cache.batch


def _announcer(config: TrainConfig) -> Callable[[str], None]:
    """Messages a person at the terminal should see (on stderr beside the progress bars)."""

    def announce(message: str) -> None:
        logger.info(message)
        if config.show_progress:
            print(message, file=sys.stderr)

    return announce


def _resume(run: _Run, path: Path) -> None:
    """Continue from the checkpoint at ``path``: weights, optimizer, schedule, RNGs, history."""
    state = restore_checkpoint(path, run.head)
    run.optimizer.load_state_dict(state["optimizer"])
    run.scheduler.load_state_dict(state["scheduler"])
    run.noise_rng.set_state(state["noise_rng"])
    torch.set_rng_state(state["torch_rng"])
    run.result.losses = list(state["losses"])
    run.result.steps = run.result.resumed_from = int(state["step"])
    run.tokens_seen = int(state.get("tokens_seen", 0))
    run.result.curve = [CurvePoint(**point) for point in state.get("curve", [])]
    logger.info("resumed from %s (step %d of %d)", path, run.result.steps, run.total)


def _train_steps(run: _Run) -> None:
    """Steps from where the run stands to the end; Ctrl+C saves a checkpoint at that step."""
    config, result, timing = run.config, run.result, run.result.timing
    params = [p for group in run.optimizer.param_groups for p in group["params"]]
    updating = False  # True while the weights and the optimizer state disagree
    try:
        for step in range(result.steps, run.total):
            picked = batch_indices(len(run.examples), config.batch_size, step, config.seed)
            started = time.perf_counter()
            batch = run.source(picked)
            loaded = time.perf_counter()
            output = _loss(run.head, batch, config, run.noise_rng)
            run.optimizer.zero_grad(set_to_none=True)
            output.loss.backward()
            if config.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
            updating = True
            run.optimizer.step()
            run.scheduler.step()
            result.steps = done = step + 1
            updating = False
            tokens = sum(min(len(run.examples[i].input_ids), config.max_length) for i in picked)
            run.tokens_seen += tokens
            timing.batch_s += loaded - started
            timing.head_s += time.perf_counter() - loaded
            timing.tokens, timing.steps = timing.tokens + tokens, timing.steps + 1
            result.losses.append(float(output.loss.detach()))
            result.accuracies, result.estimated_tau = output.accuracies, output.estimated_tau()
            tau = None
            due = config.eval_every and done % config.eval_every == 0
            if run.evaluate is not None and (due or done == run.total):
                tau = _evaluate(run.head, run.evaluate)  # the last one is the head's final tau
                run.add_point(tau, result.estimated_tau)
                result.tau = tau if done == run.total else None
            _report(run, output, tau)
            due = config.checkpoint_every and done % config.checkpoint_every == 0
            if due or (config.checkpoint_every and done == run.total):
                run.save_checkpoint()
    except KeyboardInterrupt:
        # Save where we are, so that resume=True continues from this very step.
        if not updating and result.steps > (result.resumed_from or 0):
            run.save_checkpoint()
        raise


def _loss(head: DraftHead, batch: TargetBatch, config: TrainConfig, rng) -> LossOutput:
    if config.kind is HeadKind.EAGLE1:
        return eagle1_loss(head, batch, noise=config.noise, generator=rng)
    return eagle3_loss(head, batch, ttt_steps=config.ttt_steps)


def _evaluate(head: DraftHead, evaluate: Callable[[DraftHead], float]) -> float:
    head.eval()
    try:
        with torch.no_grad():
            return float(evaluate(head))
    finally:
        head.train()


def _progress_bar(config: TrainConfig, total: int, start: int):
    if not config.show_progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=start, desc=f"train {config.kind.value} head", unit="step")


def _report(run: _Run, output: LossOutput, tau: float | None) -> None:
    """One step's numbers to the progress bar, the log and the caller's callback."""
    result, done, total = run.result, run.result.steps, run.total
    accuracy = output.accuracies[0] if output.accuracies else 0.0
    progress = TrainProgress(
        step=done,
        total_steps=total,
        loss=result.losses[-1],
        accuracy=accuracy,
        estimated_tau=result.estimated_tau,
        lr=run.scheduler.get_last_lr()[0],
        tau=tau,
    )
    if run.bar is not None:
        postfix = {
            "loss": f"{progress.loss:.3f}",
            "acc": f"{accuracy:.2f}",
            "tau~": f"{progress.estimated_tau:.2f}",
        }
        if tau is not None:
            postfix["tau"] = f"{tau:.2f}"
        run.bar.set_postfix(postfix, refresh=False)
        run.bar.update(1)
    if done % max(1, run.config.log_every) == 0 or done == total or tau is not None:
        logger.info(
            "step %d/%d loss %.4f acc %.3f est. tau %.2f lr %.2e%s",
            done,
            total,
            progress.loss,
            accuracy,
            progress.estimated_tau,
            progress.lr,
            f" held-out tau {tau:.2f}" if tau is not None else "",
        )
    if run.progress_callback is not None:
        run.progress_callback(progress)


def _settings(config: TrainConfig) -> dict[str, Any]:
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()}
    settings["kind"] = config.kind.value
    return settings


def _curve_about(config: TrainConfig) -> dict[str, Any]:
    """What eval_curve.json records beside its points: the run's settings and data."""
    settings = _settings(config)
    about = settings.pop("about")
    title = f"{config.kind.value} head: held-out tau while training"
    return {"title": title, "data": about, "config": settings}


def _write_summary(out_dir: Path, config: TrainConfig, result: TrainResult) -> None:
    """training_summary.json next to the head: how it was trained and what it reached."""
    summary = {
        "config": _settings(config),
        "steps": result.steps,
        "final_loss": result.final_loss,
        "teacher_forced_accuracy": result.accuracies,
        "estimated_tau": result.estimated_tau,
        "held_out_tau": result.tau,
        "resumed_from": result.resumed_from,
        "timing": result.timing.to_json(),
    }
    (out_dir / "training_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
