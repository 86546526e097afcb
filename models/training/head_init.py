"""A fresh draft head shaped for its target: the target's head configuration, a seeded
initialisation, the EAGLE-3 draft vocabulary (the most frequent trained tokens) and an lm_head
and norm that start as the target's own.

    head = build_head_for_target(target, tokenizer, examples, train_config)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

import torch
from torch import nn

from models.errors import IncompatibleHeadError
from models.features import decoder_of
from models.heads.base import DraftHead
from models.heads.config import HeadKind, head_config_for_target
from models.heads.eagle3 import MIN_TARGET_LAYERS
from models.heads.registry import head_class
from models.training.data import TokenizedExample
from models.training.draft_vocab import build_draft_vocab, install_draft_vocab, token_counts

logger = logging.getLogger(__name__)


class HeadSettings(Protocol):
    """What shapes a new head beyond its target (a TrainConfig has these)."""

    kind: HeadKind
    draft_vocab_size: int | None  # EAGLE-3 reduced vocabulary; None = the target's
    intermediate_size: int | None  # MLP width; None = the target's
    init_from_target: bool  # EAGLE-3: lm_head and norm start as the target's
    seed: int


def build_head_for_target(
    target: nn.Module, tokenizer, examples: Sequence[TokenizedExample], config: HeadSettings
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
