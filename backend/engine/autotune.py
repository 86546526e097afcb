"""Tree-size choice from measured costs and measured acceptance (issue: speed on every device).

Expected speed of a tree shape = expected tokens per round / expected seconds per round, where
- seconds per round = target forward over N tree nodes (timed on this device at first use)
  + D head steps (timed) ;
- tokens per round = 1 + sum_{d=1..D} prod_{j<=d} r_j, with r_j the conditional acceptance
  rate at depth j (exponential moving average over recent rounds), adjusted for tree width.
Plain decoding (no drafting) is one of the candidates: when drafts keep failing (a head that
does not fit, a high temperature) the policy falls back to it, so EAGLE never runs much slower
than vanilla, and it probes a small tree again after a growing number of plain steps.
On CPUs verifying many nodes costs several single steps, so small trees win; on GPUs the cost
is nearly flat and large trees win: the same rule picks both from the timings.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from backend.config import TreeConfig
from backend.engine.device import device_sync
from backend.engine.tree import DraftTree

# Candidate shapes (total_tokens incl. root, depth, top_k), small to large.
LADDER: tuple[TreeConfig, ...] = tuple(
    TreeConfig(total_tokens=n, depth=d, top_k=k)
    for n, d, k in (
        (2, 1, 1), (3, 2, 1), (4, 3, 1), (5, 4, 1), (6, 5, 1), (7, 6, 1), (6, 3, 2), (8, 4, 2),
        (10, 5, 2),
        (12, 5, 3), (16, 5, 4), (16, 6, 3), (24, 6, 4), (32, 6, 6), (48, 7, 8), (60, 7, 10),
    )
)  # fmt: skip
# Sampled drafts (temperature > 0) are drawn as chains (drafter.py). A second chain beside the
# first mostly re-draws what the first covered; on the CPU demo pair it measured slower at the
# same acceptance (1.27x against 1.72x for a 6-deep chain), so the policy chooses among chains.
SAMPLED_LADDER: tuple[TreeConfig, ...] = tuple(
    TreeConfig(total_tokens=d + 1, depth=d, top_k=1) for d in range(1, 9)
)
MEASURED_SIZES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 60)
PRIOR_RATE = 0.5  # conditional acceptance assumed before any observation
EMA = 0.15  # weight of the newest round in the acceptance estimates
WIDTH_GAIN_CAP = 0.15  # most a wider tree may add to a depth's acceptance rate
FIRST_PROBE_AFTER = 8  # plain steps before re-trying drafts; doubles up to MAX_PROBE_GAP
MAX_PROBE_GAP = 64


@dataclass(frozen=True, slots=True)
class CostModel:
    """Seconds per target forward by number of verified tokens, and per head draft step (of a
    branching tree, and of a top-1 chain, which skips the tree bookkeeping)."""

    verify_s: dict[int, float]
    draft_step_s: float
    chain_step_s: float = 0.0  # 0 = same as draft_step_s

    def verify(self, size: int) -> float:
        sizes = sorted(self.verify_s)
        for known in sizes:
            if known >= size:
                return self.verify_s[known]
        return self.verify_s[sizes[-1]] * size / sizes[-1]

    def round_s(self, tree: TreeConfig | None) -> float:
        if tree is None:
            return self.verify(1)
        return self.verify(tree.total_tokens) + tree.depth * self.step_s(chain=tree.top_k == 1)

    def step_s(self, chain: bool) -> float:
        """One head step, in a top-1 chain or in a branching tree."""
        if chain and self.chain_step_s > 0:
            return self.chain_step_s
        return self.draft_step_s

    def verify_ratio(self, size: int) -> float:
        """Cost of verifying ``size`` tokens relative to one plain step."""
        return self.verify(size) / self.verify(1)


def measure_costs(runner, drafter, context: int = 64, repeats: int = 5) -> CostModel:
    """Time target forwards of each candidate width and one head step on this device.

    The minimum over repeats is kept (other processes only ever add time), and costs are made
    non-decreasing in the number of tokens."""
    device = runner.device
    prompt = torch.zeros(context, dtype=torch.long)
    verify_s: dict[int, float] = {}
    with torch.inference_mode():
        for size in MEASURED_SIZES:
            chain = DraftTree.from_parents(
                torch.zeros(size, dtype=torch.long), torch.arange(-1, size - 1)
            )
            samples = []
            for _ in range(repeats):
                cache = runner.new_cache()
                runner.prefill(prompt, cache, with_features=False)
                device_sync(device)
                start = time.perf_counter()
                runner.verify(chain, cache, with_features=True)
                device_sync(device)
                samples.append(time.perf_counter() - start)
            verify_s[size] = min(samples)
    running = 0.0
    for size in MEASURED_SIZES:  # more tokens never cost less
        running = max(running, verify_s[size])
        verify_s[size] = running
    draft_step_s = chain_step_s = 0.0
    if drafter is not None:
        draft_step_s = _time_head_step(runner, drafter, prompt, repeats, top_k=2)
        chain_step_s = _time_head_step(runner, drafter, prompt, repeats, top_k=1)
    return CostModel(verify_s=verify_s, draft_step_s=draft_step_s, chain_step_s=chain_step_s)


def _time_head_step(runner, drafter, prompt: torch.Tensor, repeats: int, top_k: int) -> float:
    cache = runner.new_cache()
    step = runner.prefill(prompt, cache, with_features=True)
    tree = TreeConfig(total_tokens=1 + 4 * top_k, depth=4, top_k=top_k)
    samples = []
    for _ in range(repeats):
        drafter.begin(prompt, 0, step.features)
        drafter.propose(0, TreeConfig(total_tokens=2, depth=1, top_k=1))  # flush the prompt
        device_sync(runner.device)
        start = time.perf_counter()
        drafter.propose(0, tree)
        device_sync(runner.device)
        samples.append((time.perf_counter() - start) / 4)
    return min(samples)


_UNKNOWN = object()


@dataclass
class TreePolicy:
    """Per-generation choice of the next round's tree (None = a plain step, no drafting)."""

    costs: CostModel
    ladder: tuple[TreeConfig, ...] = LADDER  # SAMPLED_LADDER for temperature > 0
    rates: list[float] = field(default_factory=lambda: [PRIOR_RATE] * 8)
    current_width: float = 2.0  # nodes per level of the tree the rates were measured on
    plain_steps: int = 0
    probe_gap: int = FIRST_PROBE_AFTER
    _best: object = field(default=None, repr=False)  # cached choice; _UNKNOWN after observe

    def __post_init__(self) -> None:
        self._best = _UNKNOWN

    @classmethod
    def for_decoding(cls, costs: CostModel, sampled: bool) -> TreePolicy:
        """A policy over the shapes the drafter builds: top-k trees, or chains when sampling."""
        return cls(costs, ladder=SAMPLED_LADDER if sampled else LADDER)

    def begin_request(self) -> None:
        """A new prompt is new text: if drafting was switched off, probe on its first round
        rather than carrying the old reply's back-off into it."""
        self.plain_steps = self.probe_gap

    def choose(self) -> TreeConfig | None:
        if self._best is _UNKNOWN:  # estimates changed since the last choice
            self._best = self._best_tree()
        best = self._best
        if best is not None:
            self.plain_steps = 0
            self.probe_gap = FIRST_PROBE_AFTER
            return best
        self.plain_steps += 1
        if self.plain_steps >= self.probe_gap:  # look again: the text may have become easy
            self.plain_steps = 0
            self.probe_gap = min(self.probe_gap * 2, MAX_PROBE_GAP)
            return self.ladder[0]
        return None

    def _best_tree(self) -> TreeConfig | None:
        best, best_speed = None, 1.0 / self.costs.round_s(None)
        for tree in self.ladder:
            speed = self.expected_tokens(tree) / self.costs.round_s(tree)
            if speed > best_speed:
                best, best_speed = tree, speed
        return best

    def expected_tokens(self, tree: TreeConfig) -> float:
        width = (tree.total_tokens - 1) / tree.depth
        total, reach = 1.0, 1.0
        for depth in range(tree.depth):
            rate = self.rates[min(depth, len(self.rates) - 1)]
            # More candidates per level catch more of the target's choices, but a head whose
            # best guess is rarely right gains little from its worse guesses: cap the gain.
            widened = 1.0 - (1.0 - rate) * (self.current_width / width) ** 0.25
            reach *= min(max(widened, 0.0), rate + WIDTH_GAIN_CAP, 0.99)
            total += reach
        return total

    def observe(self, tree: TreeConfig, accepted: int) -> None:
        """Update the conditional acceptance rate of every depth this round could reach."""
        self._best = _UNKNOWN
        for depth in range(min(tree.depth, accepted + 1)):
            hit = 1.0 if depth < accepted else 0.0
            if depth < len(self.rates):
                self.rates[depth] += EMA * (hit - self.rates[depth])
        if accepted >= tree.depth:  # the whole depth was accepted: deeper may well pay too
            self.probe_gap = FIRST_PROBE_AFTER  # and if this was a probe, look again soon
            deepest = self.rates[min(tree.depth, len(self.rates)) - 1]
            for depth in range(tree.depth, len(self.rates)):
                self.rates[depth] = max(self.rates[depth], deepest)
        self.current_width = (tree.total_tokens - 1) / tree.depth
