"""Train an EAGLE-1/2 or EAGLE-3 draft head against a frozen transformers target.

    result = train_head(target, tokenizer, examples, TrainConfig(kind="eagle3", out_dir="out"))
    # interrupted? the same call with resume=True continues from out/checkpoint-<step>/

Per step: the target runs once under no_grad on a padded batch (features captured by hooks,
logits kept), then the head's loss (losses.py) is minimised with AdamW on the head's own
parameters; the embedding (and for EAGLE-1 the lm_head) are the target's, borrowed and frozen.
Checkpoints are the official head format (config.json + model.safetensors, loadable by
``models.checkpoints.load_head``) plus ``trainer_state.pt`` (optimizer, scheduler, step, RNG),
read back with ``weights_only=True``. The data order is a pure function of (seed, step), so the
step alone is the data position. Tau on held-out prompts comes from an injected ``evaluate``
callback: the engine lives in backend/, which models/ must not import.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from models.checkpoints import load_head, save_head
from models.errors import ConfigError, IncompatibleHeadError
from models.features import decoder_of
from models.heads.base import DraftHead
from models.heads.config import HeadKind, head_config_for_target
from models.heads.eagle3 import MIN_TARGET_LAYERS
from models.heads.registry import head_class
from models.training.data import TokenizedExample, batch_indices
from models.training.draft_vocab import build_draft_vocab, install_draft_vocab, token_counts
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

STATE_NAME = "trainer_state.pt"
CHECKPOINT_PREFIX = "checkpoint-"


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

    @property
    def final_loss(self) -> float:
        return self.losses[-1] if self.losses else float("nan")


# ---- head construction ------------------------------------------------------------------------


def build_head_for_target(
    target: nn.Module, tokenizer, examples: Sequence[TokenizedExample], config: TrainConfig
) -> DraftHead:
    """A fresh head shaped for the target, bound to it; EAGLE-3 gets its draft vocabulary."""
    num_layers = len(decoder_of(target).layers)
    if config.kind is HeadKind.EAGLE3 and num_layers < MIN_TARGET_LAYERS:
        raise IncompatibleHeadError(
            f"an EAGLE-3 head needs a target with at least {MIN_TARGET_LAYERS} layers, "
            f"this one has {num_layers}",
            hint="train an EAGLE-1/2 head (--kind eagle1) instead",
        )
    vocab_size = target.get_output_embeddings().weight.shape[0]
    reduced = config.draft_vocab_size if config.draft_vocab_size not in (None, vocab_size) else None
    head_config = head_config_for_target(
        target.config,
        config.kind,
        draft_vocab_size=reduced,
        intermediate_size=config.intermediate_size,
    )
    with torch.random.fork_rng(devices=[]):  # a seeded init without touching the caller's RNG
        torch.manual_seed(config.seed)
        head = head_class(config.kind)(head_config)
    target_ids = torch.arange(vocab_size)
    if head_config.has_reduced_vocab:
        counts = token_counts(((e.input_ids, e.loss_mask) for e in examples), vocab_size)
        specials = getattr(tokenizer, "all_special_ids", []) if tokenizer is not None else []
        vocab = build_draft_vocab(counts, head_config.draft_vocab_size, specials)
        install_draft_vocab(head, vocab)
        target_ids = vocab.target_ids
        covered = counts[target_ids].sum() / counts.sum().clamp(min=1)
        logger.info(
            "draft vocabulary: %d tokens cover %.1f%% of assistant tokens",
            vocab.size,
            100 * float(covered),
        )
    if config.kind is HeadKind.EAGLE3 and config.init_from_target:
        _init_from_target(head, target, target_ids)
    head.bind_target(target.get_input_embeddings(), target.get_output_embeddings())
    return head


@torch.no_grad()
def _init_from_target(head: DraftHead, target: nn.Module, target_ids: torch.Tensor) -> None:
    """Start the EAGLE-3 lm_head (and norm) as the target's: the head's output then begins in
    a space where the target's own readout already works, which speeds up early training."""
    weight = target.get_output_embeddings().weight
    if weight.shape[1] == head.lm_head.weight.shape[1]:
        head.lm_head.weight.copy_(weight[target_ids.to(weight.device)].float())
    norm = getattr(decoder_of(target), "norm", None)
    norm_weight = getattr(norm, "weight", None)
    if norm_weight is not None and norm_weight.shape == head.norm.weight.shape:
        # The norm's effective gain, whatever its convention (Gemma scales by 1 + weight): an
        # RMS norm maps the all-ones vector to its gain. A large gain (Gemma's final norm) on a
        # random head output gives huge random logits, so it is capped.
        ones = torch.ones(
            1, norm_weight.shape[0], dtype=norm_weight.dtype, device=norm_weight.device
        )
        gain = norm(ones)[0].float()
        head.norm.weight.copy_(gain / gain.abs().mean().clamp(min=1.0))


# ---- input scaling ----------------------------------------------------------------------------


class _DividedColumns(nn.Module):
    """fc.weight = trained / scale (per input channel): the head trains as if its features were
    divided by their typical size, yet its fc is an ordinary Linear on the raw features.

    Some targets' residual streams are large (Gemma's reach the hundreds, with outlier channels
    far beyond): an fc output of that size swamps the midlayer's residual updates and the head
    stops learning. Dividing the trained weight instead of the input keeps the optimizer's steps
    in proportion to each column."""

    def __init__(self, scale: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("scale", scale)

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight / self.scale

    def right_inverse(self, weight: torch.Tensor) -> torch.Tensor:
        return weight * self.scale


def feature_scale(features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-channel RMS of target features [B, S, F] over real tokens after the first (attention
    sinks carry outliers), never below 1: small features are left as they are."""
    valid = mask.clone()
    valid[:, 0] = False
    rows = features[valid] if valid.any() else features.flatten(0, 1)
    return rows.float().pow(2).mean(0).sqrt().clamp(min=1.0)


def scale_fc_inputs(head: DraftHead, scale: torch.Tensor) -> None:
    """Train ``head.fc`` through :class:`_DividedColumns`; its fresh initialisation is kept as
    the trained weight, so the scaled features start at the usual size."""
    from torch.nn.utils import parametrize

    initial = head.fc.weight.detach().clone()
    parametrize.register_parametrization(
        head.fc, "weight", _DividedColumns(scale.to(initial.device, initial.dtype))
    )
    head.fc.parametrizations.weight.original.data.copy_(initial)


def plain_head(head: DraftHead) -> DraftHead:
    """The head with an ordinary fc (the official format), for saving and evaluation copies."""
    if not hasattr(head.fc, "parametrizations"):
        return head
    plain = head_class(head.kind)(head.config).to(head.fc.weight.device)
    state = {k: v for k, v in head.state_dict().items() if ".parametrizations." not in k}
    state["fc.weight"] = head.fc.weight.detach().clone()
    plain.load_state_dict(state, strict=True)
    plain.bind_target(head.embedding, head._borrowed.get("lm_head"))
    return plain


def load_plain_state(head: DraftHead, state: dict[str, torch.Tensor]) -> None:
    """Load an ordinary state dict into a head whose fc may be trained through scaled columns."""
    if not hasattr(head.fc, "parametrizations"):
        head.load_state_dict(state, strict=True)
        return
    fc_weight = state["fc.weight"]
    rest = {k: v for k, v in state.items() if k != "fc.weight"}
    expected = {k for k in head.state_dict() if ".parametrizations." not in k} - {"fc.weight"}
    if set(rest) != expected:
        raise ConfigError("checkpoint keys do not match the head being trained")
    head.load_state_dict(rest, strict=False)
    scale = head.fc.parametrizations.weight[0].scale
    head.fc.parametrizations.weight.original.data.copy_(fc_weight.to(scale.device) * scale)


# ---- schedule ---------------------------------------------------------------------------------


def warmup_cosine(total: int, warmup: int, min_ratio: float) -> Callable[[int], float]:
    """LR factor per step (for LambdaLR): linear warm-up, then cosine down to ``min_ratio``."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    return factor


# ---- checkpoints ------------------------------------------------------------------------------


def checkpoint_dirs(out_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints in ``out_dir``, oldest first."""
    found = []
    for path in Path(out_dir).glob(f"{CHECKPOINT_PREFIX}*"):
        suffix = path.name[len(CHECKPOINT_PREFIX) :]
        if suffix.isdigit() and (path / STATE_NAME).is_file():
            found.append((int(suffix), path))
    return sorted(found)


def _save_checkpoint(out_dir: Path, step: int, head: DraftHead, state: dict, keep: int) -> Path:
    final = out_dir / f"{CHECKPOINT_PREFIX}{step}"
    partial = out_dir / f".{CHECKPOINT_PREFIX}{step}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    save_head(plain_head(head), partial)
    torch.save(state, partial / STATE_NAME)
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)  # a checkpoint dir exists only once complete
    for _, old in checkpoint_dirs(out_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    logger.info("saved checkpoint %s", final)
    return final


def _restore(path: Path, head: DraftHead) -> dict:
    loaded = load_head(path)
    if loaded.config.to_dict() != head.config.to_dict():
        raise ConfigError(
            f"checkpoint {path} holds a different head than this run would train",
            hint="resume with the same kind, draft vocabulary size and target",
        )
    load_plain_state(head, loaded.state_dict())
    return torch.load(path / STATE_NAME, map_location="cpu", weights_only=True)


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
    if run.head.config.has_reduced_vocab and config.draft_readout_only:
        draft_ids = torch.arange(run.head.config.draft_vocab_size, device=run.batches.device)
        run.batches = replace(run.batches, logit_ids=run.head.to_target_ids(draft_ids))
    run.bar = _progress_bar(config, run.total, run.result.steps)
    try:
        _train_steps(run)
    finally:
        if run.bar is not None:
            run.bar.close()
    result = run.result
    head = result.head = plain_head(run.head)  # the official format from here on
    save_head(head, out_dir)
    if evaluate is not None:
        result.tau = _evaluate(head, evaluate)
    _write_summary(out_dir, config, result)
    return result


@dataclass(slots=True)
class _Run:
    """One ``train_head`` call's moving parts, from the first step to the last."""

    config: TrainConfig
    target: nn.Module
    examples: Sequence[TokenizedExample]
    head: DraftHead
    batches: BatchSpec
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    noise_rng: torch.Generator
    result: TrainResult
    total: int
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
        }
        out_dir, keep = Path(self.config.out_dir), self.config.keep_checkpoints
        _save_checkpoint(out_dir, self.result.steps, self.head, state, keep)


def _start(
    target: nn.Module, tokenizer, examples: Sequence[TokenizedExample], config: TrainConfig
) -> _Run:
    """The frozen target on its device, a fresh head for it, the optimizer and the schedule."""
    device = (
        torch.device(config.device)
        if config.device
        else target.get_input_embeddings().weight.device
    )
    if config.device and not getattr(target, "hf_device_map", None):
        target.to(device)
    target.eval().requires_grad_(False)
    head = build_head_for_target(target, tokenizer, examples, config).to(device).train()
    feature_layers = head.feature_layers(len(decoder_of(target).layers))
    batches = BatchSpec(feature_layers, pad_id_of(tokenizer), config.max_length, device)
    if head.kind is HeadKind.EAGLE3:
        first = batch_indices(len(examples), config.batch_size, 0, config.seed)
        sample = target_batch(target, [examples[i] for i in first], batches)
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
    result = TrainResult(head=head, out_dir=Path(config.out_dir), steps=0)
    return _Run(
        config, target, examples, head, batches, optimizer, scheduler, noise_rng, result, total
    )


def _resume(run: _Run, path: Path) -> None:
    """Continue from the checkpoint at ``path``: weights, optimizer, schedule, RNGs, losses."""
    state = _restore(path, run.head)
    run.optimizer.load_state_dict(state["optimizer"])
    run.scheduler.load_state_dict(state["scheduler"])
    run.noise_rng.set_state(state["noise_rng"])
    torch.set_rng_state(state["torch_rng"])
    run.result.losses = list(state["losses"])
    run.result.steps = run.result.resumed_from = int(state["step"])
    logger.info("resumed from %s (step %d of %d)", path, run.result.steps, run.total)


def _train_steps(run: _Run) -> None:
    """Steps from where the run stands to the end; Ctrl+C saves a checkpoint at that step."""
    config, result = run.config, run.result
    params = [p for group in run.optimizer.param_groups for p in group["params"]]
    updating = False  # True while the weights and the optimizer state disagree
    try:
        for step in range(result.steps, run.total):
            picked = batch_indices(len(run.examples), config.batch_size, step, config.seed)
            batch = target_batch(run.target, [run.examples[i] for i in picked], run.batches)
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
            result.losses.append(float(output.loss.detach()))
            result.accuracies, result.estimated_tau = output.accuracies, output.estimated_tau()
            tau = None
            if run.evaluate is not None and config.eval_every and done % config.eval_every == 0:
                tau = _evaluate(run.head, run.evaluate) if done < run.total else None
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


def _write_summary(out_dir: Path, config: TrainConfig, result: TrainResult) -> None:
    """training_summary.json next to the head: how it was trained and what it reached."""
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()}
    settings["kind"] = config.kind.value
    summary = {
        "config": settings,
        "steps": result.steps,
        "final_loss": result.final_loss,
        "teacher_forced_accuracy": result.accuracies,
        "estimated_tau": result.estimated_tau,
        "held_out_tau": result.tau,
        "resumed_from": result.resumed_from,
    }
    (out_dir / "training_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
