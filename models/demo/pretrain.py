"""Pretraining of the demo target from scratch: a stock ``LlamaForCausalLM`` on packed token
windows with AdamW, warm-up + cosine, gradient clipping and resumable checkpoints (model +
optimizer + step + data position).

The schedule follows ``steps`` when given (exactly reproducible), otherwise the time budget:
the cosine is driven by the fraction of the budget spent, so the learning rate is annealed when
the budget ends whatever the machine's speed.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelShape:
    hidden: int = 192
    layers: int = 12
    heads: int = 3
    kv_heads: int = 1
    intermediate: int = 512
    max_positions: int = 1024
    rope_theta: float = 10000.0


def build_config(shape: ModelShape, tokenizer: Any) -> Any:
    """A stock LlamaConfig (tied embeddings, sdpa attention) for the tokenizer's vocabulary."""
    from transformers import LlamaConfig

    if shape.hidden % shape.heads or shape.heads % shape.kv_heads:
        raise ValueError(
            f"hidden {shape.hidden} / heads {shape.heads} / kv {shape.kv_heads} must divide evenly"
        )
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.hidden // shape.heads,
        intermediate_size=shape.intermediate,
        max_position_embeddings=shape.max_positions,
        rope_theta=shape.rope_theta,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        attn_implementation="sdpa",
    )
    return config


def build_model(config: Any, seed: int) -> Any:
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


@dataclass
class TrainOptions:
    seq_len: int = 512
    batch_size: int = 4
    lr: float = 1.5e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 150
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    steps: int | None = None  # step-driven schedule when set
    budget_seconds: float | None = None  # time-driven schedule (and hard stop) when set
    ckpt_seconds: float = 300.0
    ckpt_every_steps: int | None = None
    log_every: int = 20
    eval_windows: int = 48
    stop_after: int | None = None  # steps in THIS invocation, then checkpoint and return
    seed: int = 0


@dataclass
class TrainState:
    step: int = 0
    epoch: int = 0
    index: int = 0  # next batch within the epoch's permutation
    train_seconds: float = 0.0
    tokens_seen: int = 0
    history: list[dict[str, float]] = field(default_factory=list)
    finished: bool = False


class PackedWindows:
    """Non-overlapping windows of ``seq_len + 1`` tokens over a packed stream, shuffled per epoch
    with a seeded permutation so the data position is just (epoch, index)."""

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, seed: int) -> None:
        self.tokens = torch.from_numpy(tokens.astype(np.int64))
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.seed = seed
        self.num_windows = max(0, (len(tokens) - 1) // seq_len)
        if self.num_windows < batch_size:
            raise ValueError(
                f"{len(tokens)} tokens give {self.num_windows} windows of "
                f"{seq_len}; need at least batch_size={batch_size}"
            )
        self.batches_per_epoch = self.num_windows // batch_size
        self._perm_epoch = -1
        self._perm = torch.empty(0, dtype=torch.long)

    def _window(self, w: int) -> torch.Tensor:
        start = w * self.seq_len
        return self.tokens[start : start + self.seq_len + 1]

    def batch(self, epoch: int, index: int) -> torch.Tensor:
        if epoch != self._perm_epoch:
            g = torch.Generator().manual_seed(self.seed * 1000 + epoch)
            self._perm = torch.randperm(self.num_windows, generator=g)
            self._perm_epoch = epoch
        ids = self._perm[index * self.batch_size : (index + 1) * self.batch_size]
        return torch.stack([self._window(int(w)) for w in ids])

    def spread(self, limit: int) -> Iterator[torch.Tensor]:
        """Up to ``limit`` windows evenly spaced over the whole stream (fixed, for evaluation)."""
        n = min(limit, self.num_windows)
        for i in range(n):
            yield self._window(i * self.num_windows // n)


def lm_loss(model: Any, batch: torch.Tensor, device: torch.device) -> torch.Tensor:
    batch = batch.to(device, non_blocking=True)
    inputs, targets = batch[:, :-1], batch[:, 1:]
    with torch.autocast(
        device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"
    ):
        logits = model(input_ids=inputs, use_cache=False).logits
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))


@torch.no_grad()
def evaluate(
    model: Any, val: PackedWindows | None, device: torch.device, windows: int, batch_size: int
) -> float | None:
    if val is None or windows <= 0:
        return None
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    buf: list[torch.Tensor] = []
    for w in val.spread(windows):
        buf.append(w)
        if len(buf) == batch_size:
            total += lm_loss(model, torch.stack(buf), device).item() * len(buf)
            count += len(buf)
            buf = []
    if buf:
        total += lm_loss(model, torch.stack(buf), device).item() * len(buf)
        count += len(buf)
    model.train(was_training)
    return total / max(count, 1)


def progress(state: TrainState, opts: TrainOptions) -> float:
    """Fraction of the schedule done, by steps or by the time budget."""
    if opts.steps:
        return state.step / opts.steps
    if opts.budget_seconds:
        return state.train_seconds / opts.budget_seconds
    raise ValueError("either steps or budget_seconds must be set")


def lr_at(state: TrainState, opts: TrainOptions) -> float:
    warm = min(1.0, (state.step + 1) / max(1, opts.warmup_steps))
    p = min(1.0, progress(state, opts))
    cos = opts.min_lr_ratio + (1 - opts.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p))
    return opts.lr * warm * cos


def make_optimizer(model: Any, opts: TrainOptions) -> torch.optim.Optimizer:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 and "norm" not in name else no_decay).append(p)
    return torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": opts.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=opts.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )


def save_checkpoint(
    path: Path,
    model: Any,
    optimizer: torch.optim.Optimizer,
    state: TrainState,
    extra: dict[str, Any],
) -> None:
    """Atomic write of model + optimizer + step + data position."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "state": asdict(state),
            **extra,
        },
        tmp,
    )
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=False)


class _StopFlag:
    """Turns SIGTERM/SIGINT into a graceful 'checkpoint and stop'."""

    def __init__(self) -> None:
        self.stop = False
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _StopFlag:
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        logger.warning("signal %d: saving a checkpoint and stopping", signum)
        self.stop = True

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


@dataclass
class TrainRun:
    """What one training invocation works on; the checkpoint holds ``ckpt_extra`` too."""

    model: Any
    optimizer: torch.optim.Optimizer
    data: PackedWindows
    val: PackedWindows | None
    device: torch.device
    ckpt_path: Path
    ckpt_extra: dict[str, Any]


class _Trainer:
    """The training loop's state between steps: timers and the running loss for the log."""

    def __init__(self, run: TrainRun, state: TrainState, opts: TrainOptions) -> None:
        self.run, self.state, self.opts = run, state, opts
        self.tokens_per_step = opts.batch_size * opts.seq_len
        self.start_step = state.step
        self.last_ckpt = time.monotonic()
        self.t_log, self.tok_log, self.loss_sum, self.loss_n = time.monotonic(), 0, 0.0, 0

    def checkpoint(self, reason: str) -> None:
        run, state, opts = self.run, self.state, self.opts
        t0 = time.monotonic()
        val_loss = evaluate(run.model, run.val, run.device, opts.eval_windows, opts.batch_size)
        if state.history:
            state.history[-1]["val_loss"] = val_loss if val_loss is not None else float("nan")
        save_checkpoint(run.ckpt_path, run.model, run.optimizer, state, run.ckpt_extra)
        state.train_seconds += time.monotonic() - t0
        self.last_ckpt = time.monotonic()
        logger.info(
            "checkpoint (%s) at step %d, val_loss %s -> %s",
            reason,
            state.step,
            f"{val_loss:.4f}" if val_loss is not None else "n/a",
            run.ckpt_path,
        )

    def stop_reason(self, stop_requested: bool) -> str | None:
        """Why the loop ends before the next step, or None to go on."""
        state, opts = self.state, self.opts
        if progress(state, opts) >= 1.0:
            state.finished = True
            return "end of schedule"
        if stop_requested or (
            opts.stop_after is not None and state.step - self.start_step >= opts.stop_after
        ):
            return "stop requested"
        return None

    def step(self) -> None:
        run, state, opts = self.run, self.state, self.opts
        t0 = time.monotonic()
        lr = lr_at(state, opts)
        for group in run.optimizer.param_groups:
            group["lr"] = lr
        batch = run.data.batch(state.epoch, state.index)
        loss = lm_loss(run.model, batch, run.device)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), opts.grad_clip)
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
        loss_val = loss.item()
        if not math.isfinite(loss_val):
            raise FloatingPointError(f"loss is {loss_val} at step {state.step}")
        state.step += 1
        state.index += 1
        if state.index >= run.data.batches_per_epoch:
            state.epoch, state.index = state.epoch + 1, 0
        state.tokens_seen += self.tokens_per_step
        state.train_seconds += time.monotonic() - t0
        self.loss_sum, self.loss_n = self.loss_sum + loss_val, self.loss_n + 1
        self.tok_log += self.tokens_per_step
        if state.step % opts.log_every == 0 or state.step == 1:
            self.log(lr, float(grad_norm))
        due_time = time.monotonic() - self.last_ckpt >= opts.ckpt_seconds
        due_steps = opts.ckpt_every_steps and state.step % opts.ckpt_every_steps == 0
        if due_time or due_steps:
            self.checkpoint("periodic")

    def log(self, lr: float, grad_norm: float) -> None:
        """One history entry and log line: the mean loss since the previous one."""
        state = self.state
        now = time.monotonic()
        mean = self.loss_sum / self.loss_n
        state.history.append(
            {
                "step": state.step,
                "loss": mean,
                "lr": lr,
                "tokens": state.tokens_seen,
                "seconds": round(state.train_seconds, 1),
            }
        )
        logger.info(
            "step %6d | loss %.4f | lr %.2e | gnorm %.2f | %5.0f tok/s | %.2fM tok | "
            "epoch %d.%03d | %5.1f%% of schedule",
            state.step,
            mean,
            lr,
            grad_norm,
            self.tok_log / max(now - self.t_log, 1e-9),
            state.tokens_seen / 1e6,
            state.epoch,
            int(1000 * state.index / self.run.data.batches_per_epoch),
            100 * min(1.0, progress(state, self.opts)),
        )
        self.t_log, self.tok_log, self.loss_sum, self.loss_n = now, 0, 0.0, 0


def train(run: TrainRun, state: TrainState, opts: TrainOptions) -> TrainState:
    """Run until the schedule ends (state.finished), ``stop_after`` steps, or a signal."""
    run.model.to(run.device).train()
    trainer = _Trainer(run, state, opts)
    with _StopFlag() as flag:
        while (reason := trainer.stop_reason(flag.stop)) is None:
            trainer.step()
        trainer.checkpoint(reason)
    return state
