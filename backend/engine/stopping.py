"""Exact stopping: a round may yield several tokens, so EOS and the token budget are applied
to each round's tokens and the output is truncated, never overshooting (eagle.md §8)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from backend.events import StopReason


@dataclass(frozen=True, slots=True)
class StopCheck:
    eos_ids: frozenset[int]
    budget: int  # new tokens allowed in total
    budget_reason: StopReason = "max_new_tokens"

    def apply(self, tokens: Sequence[int], produced: int) -> tuple[list[int], StopReason | None]:
        """Tokens of this round to emit (``produced`` already emitted) and why to stop, if so."""
        kept: list[int] = []
        for token in tokens:
            if produced + len(kept) >= self.budget:
                return kept, self.budget_reason
            kept.append(token)
            if token in self.eos_ids:
                return kept, "eos"
        if produced + len(kept) >= self.budget:
            return kept, self.budget_reason
        return kept, None
