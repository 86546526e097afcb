"""Speculative-decoding statistics, accumulated per round and summarised once.

Definitions (acceptance length, tau, acceptance per depth) live in backend/events.py and are
applied here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from backend.engine.calibration import CostModel
from backend.events import (
    GenerationSummary,
    StopReason,
    TokenSource,
    acceptance_per_depth,
    average_acceptance_length,
)


@dataclass(slots=True)
class SpecStats:
    acceptance_lengths: list[int] = field(default_factory=list)  # tokens gained per round
    ttft_s: float = 0.0  # the prefill's time to the first token
    prompt_head_s: float = 0.0  # EAGLE's head over the prompt, after the first token
    draft_s: float = 0.0
    verify_s: float = 0.0
    tree_sizes: list[int] = field(default_factory=list)
    tree_shapes: Counter[str] = field(default_factory=Counter)  # rounds per verified shape
    token_sources: list[TokenSource] = field(default_factory=list)  # who wrote each new token

    def add_round(self, emitted: int, tree_size: int, draft_s: float, verify_s: float) -> None:
        """One round that emitted ``emitted`` tokens after exact stopping: its acceptance
        length."""
        self.acceptance_lengths.append(emitted)
        self.tree_sizes.append(tree_size)
        self.draft_s += draft_s
        self.verify_s += verify_s

    @property
    def rounds(self) -> int:
        return len(self.acceptance_lengths)

    @property
    def tau(self) -> float:
        return average_acceptance_length(sum(self.acceptance_lengths), self.rounds)

    def summary(
        self,
        new_token_ids: list[int],
        text: str,
        total_s: float,
        stop_reason: StopReason,
        stopped_by: str = "",
        hint: str = "",
    ) -> GenerationSummary:
        return GenerationSummary(
            new_tokens=len(new_token_ids),
            rounds=self.rounds,
            tau=self.tau,
            acceptance_lengths=tuple(self.acceptance_lengths),
            accept_per_depth=acceptance_per_depth(self.acceptance_lengths),
            tokens_per_s=len(new_token_ids) / total_s if total_s > 0 else 0.0,
            ttft_s=self.ttft_s,
            total_s=total_s,
            draft_s=self.draft_s,
            verify_s=self.verify_s,
            stop_reason=stop_reason,
            text=text,
            token_ids=tuple(new_token_ids),
            hint=hint,
            stopped_by=stopped_by,
            tree_shapes=tuple(self.tree_shapes.most_common()),
            prompt_head_s=self.prompt_head_s,
            accepted_head=self.token_sources.count("head"),
            accepted_context=self.token_sources.count("context"),
            token_sources=tuple(self.token_sources),
        )


# One set of thresholds for every "why not faster" text (the chat panel, the race, the bench).
RARE_ACCEPTANCE_TAU = 1.5  # below: under one accepted draft per two rounds, on average
COSTLY_VERIFY_RATIO = 1.5  # verifying the typical tree costs more plain steps than this
HEAVY_DRAFT_SHARE = 0.3  # drafting takes more of the round time than this


def explain(stats: SpecStats, costs: CostModel | None) -> str:
    """Plain-words reasons a speculative run may be slow, for the UI and the benchmark."""
    total = stats.draft_s + stats.verify_s
    draft_share = stats.draft_s / total if total > 0 else 0.0
    ratio = costs.verify_ratio if costs is not None else None
    return slow_reasons(stats.tau, stats.tree_sizes, draft_share, ratio)


def slow_reasons(
    tau: float,
    tree_sizes: Sequence[int],
    draft_share: float,
    verify_ratio: Callable[[int], float] | None,
) -> str:
    """The reasons behind a slow speculative run, from its rounds' verified sizes (1 = a plain
    step), its tau, the share of round time spent drafting and, when the device's costs are
    known, the cost of verifying n tokens relative to one plain step. Empty when none applies."""
    if not tree_sizes:
        return ""
    reasons = []
    drafted = [size for size in tree_sizes if size > 1]
    plain = len(tree_sizes) - len(drafted)
    if tau < RARE_ACCEPTANCE_TAU:
        reasons.append(
            f"drafts were rarely accepted (average acceptance length {tau:.2f}): the head "
            "may not fit this target, or the temperature is high"
        )
    if plain:
        reasons.append(
            f"{plain} of {len(tree_sizes)} rounds fell back to plain decoding because drafts "
            "were failing"
        )
    if verify_ratio is not None and drafted:
        typical = sorted(drafted)[len(drafted) // 2]
        ratio = verify_ratio(typical)
        if ratio > COSTLY_VERIFY_RATIO:
            reasons.append(
                f"verifying {typical} tokens costs {ratio:.1f}x a single decoding step on this "
                "device, so each round must accept several tokens to pay off"
            )
    if draft_share > HEAVY_DRAFT_SHARE:
        reasons.append(f"drafting took {100 * draft_share:.0f}% of the round time")
    return "; ".join(reasons)
