"""Reduced EAGLE-3 draft vocabulary: the Vd target tokens the head predicts most.

A head over Vd << V rows has a much cheaper lm_head; tokens outside the draft vocabulary can
still be accepted as the target's bonus token, just never drafted. The draft vocabulary is the
Vd most frequent target ids among the tokens the head learns to predict (assistant tokens),
plus every special token (eos must be draftable), sorted by target id so that

    target id = draft id + d2t[draft id]        t2d[target id] = in the draft vocabulary
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from models.errors import ConfigError
from models.heads.base import DraftHead


@dataclass(frozen=True, slots=True)
class DraftVocab:
    target_ids: torch.Tensor  # [Vd] int64, ascending target ids of the draft tokens
    vocab_size: int  # V of the target

    @property
    def size(self) -> int:
        return int(self.target_ids.numel())

    @property
    def d2t(self) -> torch.Tensor:
        """[Vd] int64 offsets: target id = draft id + d2t[draft id]."""
        return self.target_ids - torch.arange(self.size, dtype=torch.long)

    @property
    def t2d(self) -> torch.Tensor:
        """[V] bool: the target token is in the draft vocabulary."""
        mask = torch.zeros(self.vocab_size, dtype=torch.bool)
        mask[self.target_ids] = True
        return mask

    def to_draft_ids(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Map target ids to draft ids, -1 where the token is not in the draft vocabulary."""
        lookup = torch.full((self.vocab_size,), -1, dtype=torch.long)
        lookup[self.target_ids] = torch.arange(self.size, dtype=torch.long)
        return lookup.to(target_ids.device)[target_ids]


def token_counts(sequences: Iterable[tuple[list[int], list[int]]], vocab_size: int) -> torch.Tensor:
    """[V] int64 counts of the masked tokens over (input_ids, loss_mask) pairs."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids, mask in sequences:
        ids_t = torch.tensor(ids, dtype=torch.long)
        kept = ids_t[torch.tensor(mask, dtype=torch.bool)]
        counts += torch.bincount(kept, minlength=vocab_size)[:vocab_size]
    return counts


def build_draft_vocab(
    counts: torch.Tensor, draft_vocab_size: int, always_include: Iterable[int] = ()
) -> DraftVocab:
    """The ``draft_vocab_size`` most frequent ids (ties: lower id first) plus ``always_include``.

    Unseen tokens fill any remaining slots by id order, so the size is always exact."""
    vocab_size = counts.numel()
    required = sorted({int(i) for i in always_include if 0 <= int(i) < vocab_size})
    if not 0 < draft_vocab_size <= vocab_size:
        raise ConfigError(
            f"draft vocabulary size must be in 1..{vocab_size} (the target's), got {draft_vocab_size}"
        )
    if len(required) > draft_vocab_size:
        raise ConfigError(
            f"draft vocabulary size {draft_vocab_size} cannot hold the {len(required)} special tokens"
        )
    # Stable descending sort on counts keeps ties in ascending id order.
    ranked = torch.sort(counts, descending=True, stable=True).indices.tolist()
    chosen = set(required)
    for token in ranked:
        if len(chosen) >= draft_vocab_size:
            break
        chosen.add(token)
    target_ids = torch.tensor(sorted(chosen), dtype=torch.long)
    return DraftVocab(target_ids=target_ids, vocab_size=vocab_size)


def install_draft_vocab(head: DraftHead, vocab: DraftVocab) -> None:
    """Write the mapping into an EAGLE-3 head's ``d2t``/``t2d`` buffers."""
    if not head.config.has_reduced_vocab:
        raise ConfigError("only an EAGLE-3 head with a reduced draft vocabulary has d2t/t2d")
    if vocab.size != head.config.draft_vocab_size or vocab.vocab_size != head.config.vocab_size:
        raise ConfigError(
            f"draft vocabulary {vocab.size}/{vocab.vocab_size} does not fit the head's "
            f"{head.config.draft_vocab_size}/{head.config.vocab_size}"
        )
    with torch.no_grad():
        head.d2t.copy_(vocab.d2t.to(head.d2t.device))
        head.t2d.copy_(vocab.t2d.to(head.t2d.device))
