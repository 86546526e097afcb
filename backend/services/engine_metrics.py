"""Speculation counters from an engine's Prometheus ``/metrics`` text, and per-reply deltas.

vLLM counts, over the server's life: draft rounds (``vllm:spec_decode_num_drafts_total``),
drafted and accepted tokens (``..._num_draft_tokens_total``, ``..._num_accepted_tokens_total``)
and accepted tokens per draft position (``..._num_accepted_tokens_per_pos_total{position=...}``).
The difference of two snapshots taken around one reply is that reply's acceptance (plus that
of any other client's requests running at the same time).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

PREFIX = "vllm:spec_decode_"
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_POSITION = re.compile(r'position="(\d+)"')


@dataclass(frozen=True)
class SpecCounters:
    """One snapshot of the speculation counters; ``present`` is False when the server
    exports none (a server started without speculation)."""

    present: bool = False
    drafts: float = 0.0  # draft rounds
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    accepted_per_position: dict[int, float] = field(default_factory=dict)

    def minus(self, before: SpecCounters) -> SpecCounters:
        """The counts added since ``before``."""
        positions = {
            pos: value - before.accepted_per_position.get(pos, 0.0)
            for pos, value in self.accepted_per_position.items()
        }
        return SpecCounters(
            present=self.present,
            drafts=self.drafts - before.drafts,
            draft_tokens=self.draft_tokens - before.draft_tokens,
            accepted_tokens=self.accepted_tokens - before.accepted_tokens,
            accepted_per_position=positions,
        )


def parse_spec_counters(text: str) -> SpecCounters:
    """Sum each speculation counter over its label sets (models, engines)."""
    totals = {"drafts": 0.0, "draft_tokens": 0.0, "accepted_tokens": 0.0}
    names = {
        f"{PREFIX}num_drafts_total": "drafts",
        f"{PREFIX}num_draft_tokens_total": "draft_tokens",
        f"{PREFIX}num_accepted_tokens_total": "accepted_tokens",
    }
    per_position: dict[int, float] = {}
    present = False
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or not match["name"].startswith(PREFIX):
            continue
        try:
            value = float(match["value"])
        except ValueError:
            continue
        name = match["name"]
        if name in names:
            totals[names[name]] += value
            present = True
        elif name == f"{PREFIX}num_accepted_tokens_per_pos_total":
            position = _POSITION.search(match["labels"] or "")
            if position is not None:
                index = int(position.group(1))
                per_position[index] = per_position.get(index, 0.0) + value
    return SpecCounters(present=present, accepted_per_position=per_position, **totals)
