"""Draft-head losses on one batch of precomputed target outputs.

Indexing: a head position p pairs the target feature of position p with token p+1 and predicts
the feature of position p+1, whose distribution is the target's for token p+2 (the target's
logits at position p+1). With S tokens there are P = S-1 head positions.

Which positions train: p counts when token p+1 is an assistant token (``loss_mask[p+1]``), i.e.
exactly the contexts in which the engine drafts: its root is always a token the target produced.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from models.features import FeatureCapture, decoder_of
from models.heads.base import DraftHead
from models.training.data import TokenizedExample, pad_examples

EAGLE1_VALUE_WEIGHT = 1.0  # smooth-L1 feature regression
EAGLE1_PROB_WEIGHT = 0.1  # soft cross-entropy against the target's next-token distribution
EAGLE3_STEP_DECAY = 0.8  # TTT step j is weighted 0.8**j


@dataclass(slots=True)
class DraftTargets:
    """The target's next-token distribution at each position over the head's output columns
    (its draft vocabulary, or the whole vocabulary), dense or as its top entries only (a feature
    cache keeps those). Both give the same loss arithmetic: soft cross-entropy and agreement."""

    probs: torch.Tensor  # [B, S, C] dense, or [B, S, k] over ``columns`` (renormalised)
    columns: torch.Tensor | None  # [B, S, k] long column ids of sparse ``probs``; None = dense
    argmax: torch.Tensor  # [B, S] long: column of the target's best token among the columns
    # [B, S] bool: the target's best token of its WHOLE vocabulary is one of the columns
    in_vocab: torch.Tensor

    def shifted(self) -> DraftTargets:
        """Positions 1.. (what head position p predicts is the target's output at p+1)."""
        columns = self.columns[:, 1:] if self.columns is not None else None
        return DraftTargets(self.probs[:, 1:], columns, self.argmax[:, 1:], self.in_vocab[:, 1:])

    def cross_entropy(self, logits: torch.Tensor) -> torch.Tensor:
        """[B, P, C] head logits -> [B, P]: -sum p log q, in float32."""
        log_q = torch.log_softmax(logits.float(), dim=-1)
        if self.columns is not None:
            log_q = log_q.gather(-1, self.columns)
        return -(self.probs.float() * log_q).sum(-1)

    def agrees(self, logits: torch.Tensor) -> torch.Tensor:
        """[B, P] bool: the head's top column is the target's best token."""
        return (logits.argmax(-1) == self.argmax) & self.in_vocab

    def rows(self, mask: torch.Tensor) -> DraftTargets:
        """The positions where ``mask`` [B, P] holds, as rows [M, ...]."""
        columns = self.columns[mask] if self.columns is not None else None
        return DraftTargets(self.probs[mask], columns, self.argmax[mask], self.in_vocab[mask])

    def top(self, k: int) -> DraftTargets:
        """The ``k`` most likely columns per position, renormalised (from dense targets)."""
        values, columns = self.probs.topk(min(k, self.probs.shape[-1]), dim=-1)
        values = values / values.sum(-1, keepdim=True).clamp(min=torch.finfo(values.dtype).tiny)
        return DraftTargets(values, columns, self.argmax, self.in_vocab)


@dataclass(slots=True)
class TargetBatch:
    """What the losses need from the frozen target, computed under no_grad (or read from a
    feature cache)."""

    input_ids: torch.Tensor  # [B, S] long, right-padded
    loss_mask: torch.Tensor  # [B, S] bool, assistant tokens (False on padding)
    features: torch.Tensor  # [B, S, F] captured target features (F = H or 3H)
    targets: DraftTargets  # the target's distribution at each position


@dataclass(slots=True)
class LossOutput:
    loss: torch.Tensor  # scalar, differentiable
    accuracies: list[float] = field(default_factory=list)  # teacher-forced top-1 per draft depth
    positions: int = 0  # head positions that carried loss at depth 1

    def estimated_tau(self) -> float:
        """Acceptance length a chain draft would reach if depths were independent:
        1 + a1 + a1*a2 + ... (the bonus token plus each accepted draft)."""
        tau, chain = 1.0, 1.0
        for accuracy in self.accuracies:
            chain *= accuracy
            tau += chain
        return tau


@dataclass(frozen=True, slots=True)
class BatchSpec:
    """How a training batch is asked of the frozen target: the features the head reads, the
    padding, the length cut and the device. ``columns`` are the target ids of the head's output
    columns (its draft vocabulary; None = the whole vocabulary); ``readout_only`` computes the
    target's logits on those columns alone."""

    feature_layers: tuple[int, ...]
    pad_id: int
    max_length: int
    device: torch.device
    columns: torch.Tensor | None = None
    readout_only: bool = False


@torch.no_grad()
def target_batch(
    target: nn.Module, examples: Sequence[TokenizedExample], spec: BatchSpec
) -> TargetBatch:
    """Pad a batch on the right and run the frozen target once: features and targets.

    With ``spec.readout_only`` only the head's columns of the target's readout are computed: for
    a large vocabulary (Gemma's 262k) the full readout costs more than all decoder layers
    together. Positions whose best token lies outside the columns then train toward the best
    token among them.
    """
    device, columns = spec.device, spec.columns
    ids, mask, valid = pad_examples(examples, spec.pad_id, spec.max_length, device)
    with FeatureCapture(target, spec.feature_layers) as capture:
        if columns is not None and spec.readout_only:
            hidden = decoder_of(target)(input_ids=ids, attention_mask=valid).last_hidden_state
            logits = partial_readout(target, hidden, columns).to(device)  # [B, S, C]
        else:
            logits = target(input_ids=ids, attention_mask=valid).logits.to(device)  # [B, S, V]
        features = capture.features().to(device)  # [B, S, F] (a dispatched target may differ)
    return TargetBatch(ids, mask, features, dense_targets(logits, columns, spec.readout_only))


def dense_targets(
    logits: torch.Tensor, columns: torch.Tensor | None, readout_only: bool
) -> DraftTargets:
    """The target's logits [B, S, V] (or [B, S, C] when ``readout_only``) as targets over the
    head's columns: softmax over them, which is gather + renormalise."""
    in_vocab = torch.ones(logits.shape[:-1], dtype=torch.bool, device=logits.device)
    if columns is not None and not readout_only:
        index = columns.to(logits.device)
        in_vocab = torch.isin(logits.argmax(-1), index)
        logits = logits[..., index]
    probs = torch.softmax(logits.float(), dim=-1)
    return DraftTargets(probs, None, probs.argmax(-1), in_vocab)


def partial_readout(target: nn.Module, hidden: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The target's logits for the vocabulary entries ``ids`` only (final soft-capping kept)."""
    readout = target.get_output_embeddings()
    index = ids.to(readout.weight.device)
    bias = readout.bias[index] if getattr(readout, "bias", None) is not None else None
    logits = F.linear(hidden.to(readout.weight.device), readout.weight[index], bias)
    cap = getattr(target.config, "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


def pad_id_of(tokenizer) -> int:
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None) if tokenizer is not None else None
        if value is not None:
            return int(value)
    return 0


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def eagle1_loss(
    head: DraftHead,
    batch: TargetBatch,
    noise: float = 0.2,
    generator: torch.Generator | None = None,
) -> LossOutput:
    """smooth-L1(h_p, f_{p+1}) + 0.1 * CE(target distribution_{p+1}, lm_head(h_p)).

    The input features get uniform noise in [-noise/2, noise/2] (the reference's 0.2 -> +-0.1),
    so the head tolerates its own imperfect features when it drafts several steps ahead. The
    target distribution is taken from the target's own logits (equal to lm_head(f_{p+1}) for
    plain models, and still right for targets that post-process logits, e.g. soft-capping)."""
    features = batch.features.float()  # [B, S, H] final normed hidden
    hidden_in = features[:, :-1]
    if noise > 0:
        rand = torch.rand(
            hidden_in.shape, generator=generator, device=hidden_in.device, dtype=hidden_in.dtype
        )
        hidden_in = hidden_in + (rand - 0.5) * noise
    tokens_in = batch.input_ids[:, 1:]  # [B, P]
    positions = torch.arange(tokens_in.shape[1], device=tokens_in.device)[None]
    mask = batch.loss_mask[:, 1:]  # [B, P]
    dtype = head.dtype_device()[0]
    out = head(hidden_in.to(dtype), tokens_in, positions, None, None)  # [B, P, H]
    value = F.smooth_l1_loss(out.float(), features[:, 1:], reduction="none").mean(-1)
    prob, accuracy = readout_loss(head, out, batch.targets.shifted(), mask)
    loss = EAGLE1_VALUE_WEIGHT * _masked_mean(value, mask) + EAGLE1_PROB_WEIGHT * prob
    return LossOutput(loss, [accuracy], int(mask.sum()))


def readout_loss(
    head: DraftHead, out: torch.Tensor, targets: DraftTargets, mask: torch.Tensor
) -> tuple[torch.Tensor, float]:
    """Soft cross-entropy of the head's logits against ``targets``, averaged over the positions
    of ``mask`` [B, P] whose target's best token is one of the head's columns, and the top-1
    agreement over all of ``mask``. The readout runs on those positions only: padding and
    positions without loss (a large vocabulary makes the readout most of a step) cost nothing."""
    rows = targets.rows(mask)
    logits = head.logits(out[mask])  # [M, C]
    weight = rows.in_vocab.to(torch.float32)
    loss = (rows.cross_entropy(logits) * weight).sum() / weight.sum().clamp(min=1.0)
    count = rows.argmax.numel()
    return loss, float(rows.agrees(logits).sum()) / count if count else 0.0


class _StepKeys:
    """Collects every TTT step's keys/values (the head's attention calls ``update(k, v, 0)``);
    step j's queries then see steps 0..j through the additive mask of :func:`ttt_attention_bias`."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int):
        if self.keys is None:
            self.keys, self.values = keys, values
        else:
            self.keys = torch.cat([self.keys, keys], dim=-2)
            self.values = torch.cat([self.values, values], dim=-2)
        return self.keys, self.values


def ttt_attention_bias(
    positions: int, step: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """[1, 1, P, (step+1)*P] additive mask for TTT step j over the keys of steps 0..j.

    Query p of step j is the depth-(j+1) draft whose last committed (true-feature) entry is
    position p-j. Like a tree node in the engine, it sees the committed prefix (step-0 keys at
    q <= p-j) and its own chain of drafted ancestors, one per earlier step: step i's key at
    position p-j+i for i = 1..j (i = j is itself). Rows p < j have no real chain: they carry no
    loss and no valid row attends to them."""
    p = torch.arange(positions, device=device)[:, None]  # [P, 1]
    q = torch.arange(positions, device=device)[None, :]  # [1, P]
    blocks = [q <= p - step]  # step 0: causal prefix up to the chain's root
    for i in range(1, step + 1):
        blocks.append(q == p - step + i)  # the ancestor drafted at step i (itself when i == j)
    allowed = torch.cat(blocks, dim=1)  # every row holds at least itself
    bias = torch.zeros(allowed.shape, dtype=dtype, device=device)
    bias.masked_fill_(~allowed, torch.finfo(dtype).min)
    return bias[None, None]


def eagle3_loss(head: DraftHead, batch: TargetBatch, ttt_steps: int = 7) -> LossOutput:
    """EAGLE-3 training-time test: unroll ``ttt_steps`` draft depths with teacher-forced tokens.

    Step 0: hidden input at position p is fc(target features of p), token p+1.
    Step j > 0: hidden input at position p is the head's step-(j-1) OUTPUT at position p-1 (its
    prediction of the feature of p), token p+1 (the true token), position id p; attention as in
    :func:`ttt_attention_bias`. This is what the drafter runs at depth j+1, with true tokens.
    Every step predicts token p+2: soft cross-entropy against the target's distribution at p+1
    restricted to the draft vocabulary (softmax over the gathered logits = gather + renormalise),
    weighted 0.8**j. Position p counts at step j when tokens p+1 and p-j+1 (the chain's root) are
    assistant tokens and, as in the reference, the target's argmax is in the draft vocabulary.
    Gradients flow through the whole unroll (the fed-back outputs are not detached)."""
    dtype, device = head.dtype_device()
    tokens_in = batch.input_ids[:, 1:]  # [B, P]
    count = tokens_in.shape[1]
    base_mask = batch.loss_mask[:, 1:]  # [B, P]
    targets = batch.targets.shifted()  # over the draft vocabulary
    hidden = head.project(batch.features[:, :-1].to(dtype))  # [B, P, H]
    outputs = ttt_unroll(head, hidden, tokens_in, min(ttt_steps, count))
    total = torch.zeros((), device=device)
    accuracies: list[float] = []
    for step, out in enumerate(outputs):
        root_mask = torch.zeros_like(base_mask)
        root_mask[:, step:] = base_mask[:, : count - step]  # token p-j+1 is an assistant token
        step_loss, accuracy = readout_loss(head, out, targets, base_mask & root_mask)
        total = total + EAGLE3_STEP_DECAY**step * step_loss
        accuracies.append(accuracy)
    return LossOutput(total, accuracies, int(base_mask.sum()))


def ttt_unroll(
    head: DraftHead, hidden: torch.Tensor, tokens_in: torch.Tensor, steps: int
) -> list[torch.Tensor]:
    """The head's outputs [B, P, H] for steps 0..steps-1 (see :func:`eagle3_loss`), given the
    projected target features ``hidden`` [B, P, H] and the tokens ``tokens_in`` [B, P]."""
    dtype, device = head.dtype_device()
    count = tokens_in.shape[1]
    positions = torch.arange(count, device=device)[None]
    kv = _StepKeys()
    outputs = []
    for step in range(steps):
        bias = ttt_attention_bias(count, step, dtype, device)
        out = head(hidden, tokens_in, positions, bias, kv)  # [B, P, H]
        outputs.append(out)
        hidden = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], dim=1)  # p <- o_{p-1}
    return outputs
