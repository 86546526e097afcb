"""The round auto-tuner: a small bandit over what a round drafts. docs/tuning.md gives the whole
rule and the reason for every constant.

An arm is a head shape (or none) plus a context option (or none); its value is tokens per round
over seconds per round. Its tokens: what the largest arm it covers accepts, plus its replayed gain
over that arm (a fading mean); its seconds: a fading mean of its rounds, seeded by calibration.
Thompson sampling with one normal draw per round picks the arm.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from backend.config import DraftSources, TreeConfig
from backend.engine.calibration import CostModel
from backend.engine.context_drafts import matched_length
from backend.engine.replay import Drafted, covers, decide

# The head's shapes on offer (total tokens incl. the root / depth / top-k): chains, and trees
# from narrow to wide. Sampled drafts are chains: a second sampled branch re-draws the first.
HEAD_SHAPES = tuple(
    TreeConfig(total_tokens=n, depth=d, top_k=k)
    for n, d, k in [(depth + 1, depth, 1) for depth in range(1, 9)]
    + [(8, 4, 2), (12, 5, 3), (16, 5, 4), (16, 5, 10)]
    + [(24, 6, 4), (32, 6, 8), (48, 7, 8), (60, 7, 10)]
)
SAMPLED_SHAPES = HEAD_SHAPES[:8]
CONTEXT_OPTIONS = ((4, 2), (12, 1), (32, 1))  # (tokens per chain, chains at most)
MAX_ROUND_COST = 3.0  # head shapes whose calibrated round costs more plain steps are not offered
PRIOR_ACCEPT = 0.5  # before any round, each draft is believed held with this chance
PRIOR_SPREAD = 1.0  # an arm's prior is one round, give or take this many tokens
WINDOW = 32  # rounds a mean rests on at most: older ones fade, so the tuner follows the text
# each round, the evidence of every gain fades by this share, whether or not the round taught it:
# an arm left unrun for a few hundred rounds is uncertain again, so it gets tried again
FORGET = 1 / 128


@dataclass(frozen=True, slots=True)
class Arm:
    head: TreeConfig | None = None  # the head's shape; None: no head drafts
    context: int = 0  # tokens per context chain; 0: no context drafts
    chains: int = 0  # context chains at most

    @property
    def depth(self) -> int:
        return max(self.head.depth if self.head else 0, self.context)

    @property
    def drafts(self) -> bool:
        return self.head is not None or self.context > 0

    def covers(self, other: Arm) -> bool:
        """Whether a round of this arm tells what ``other`` would have accepted (replay.py)."""
        heads = other.head is None or (self.head is not None and covers(self.head, other.head))
        return heads and other.context <= self.context and other.chains <= self.chains

    def label(self) -> str:
        parts = [self.head.label()] if self.head else []
        if self.context:
            parts.append(f"context {self.context}" + (f"x{self.chains}" if self.chains > 1 else ""))
        return " + ".join(parts) or "plain"


@dataclass(slots=True)
class FadingMean:
    """A mean over the last WINDOW observations or so: the plain mean of the first ones, then
    each new one weighs 1 / WINDOW (with its fading variance)."""

    count: float = 0.0  # observations, at most WINDOW
    mean: float = 0.0
    spread: float = 0.0

    def add(self, value: float) -> None:
        self.count = min(self.count + 1.0, WINDOW)
        weight, delta = 1.0 / self.count, value - self.mean
        self.mean += weight * delta
        self.spread = (1.0 - weight) * (self.spread + weight * delta * delta)

    def posterior(self, prior: float, spread: float) -> tuple[float, float]:
        """A normal posterior's mean and standard deviation: a prior of one observation at
        ``prior``, give or take ``spread``, pooled with the observations (their spread, and how
        far their mean lies from the prior)."""
        count = self.count
        centre = (prior + count * self.mean) / (count + 1.0)
        disagreement = count / (count + 1.0) * (self.mean - prior) ** 2
        variance = (spread**2 + count * self.spread + disagreement) / (count + 1.0)
        return centre, math.sqrt(variance / (count + 1.0))


@dataclass(slots=True)
class ArmStats:
    seconds: FadingMean = field(default_factory=FadingMean)  # of the rounds it ran
    # replayed tokens per round beyond the largest arm it covers (all, for an arm covering none):
    # after a context miss (every round for an arm without context drafts), and after a hit
    gains: tuple[FadingMean, ...] = field(default_factory=lambda: (FadingMean(), FadingMean()))


@dataclass(slots=True)
class _Pending:
    """A round whose head drafts or context candidates the text has not decided for every arm."""

    start: int  # where the drafts would have continued the text
    candidates: list[tuple[int, ...]]
    replayed: dict[TreeConfig | None, int | Drafted | None]  # replay.py's, by covered shape
    hit: bool  # the round came right after a context hit
    options: set[tuple[int, int]]  # (length, chains) of the context options still to teach
    decided: dict[tuple[int, int], int] = field(default_factory=dict)

    def context(self, length: int, chains: int, text: Sequence[int], final: bool) -> int | None:
        """Tokens of the first ``chains`` candidates the text repeats; None while it has not
        decided them (``final``: the reply ended, take what the text shows)."""
        if (length, chains) not in self.decided:
            candidates = self.candidates[:chains]
            matched = [matched_length(c[:length], text, self.start) for c in candidates]
            if None in matched and not final:
                return None
            repeated = (len(text) - self.start if m is None else m for m in matched)
            self.decided[length, chains] = max(repeated, default=0)
        return self.decided[length, chains]

    def accepted(self, arm: Arm, text: Sequence[int], final: bool) -> float | None:
        head = self.replayed.get(arm.head)  # None: a head shape the round did not cover
        context = self.context(arm.context, arm.chains, text, final)
        return None if head is None or context is None else 1.0 + max(head, context)


def head_menu(costs: CostModel, shapes: Sequence[TreeConfig]) -> list[TreeConfig]:
    """The head shapes worth offering on this device: those whose calibrated round costs at
    most MAX_ROUND_COST plain steps (a wider menu where verification is cheap, as on GPUs)."""
    return [s for s in shapes if costs.round_s(s) <= MAX_ROUND_COST * costs.round_s(None)]


class TreePolicy:
    """Per-pair choice of each round's arm, learned from every round it sees."""

    def __init__(self, costs: CostModel, arms: Sequence[Arm], seed: int = 0) -> None:
        self.costs, self.arms = costs, tuple(arms)
        self.stats = {arm: ArmStats() for arm in self.arms}
        self.heads = sorted({a.head for a in self.arms if a.head}, key=lambda s: s.total_tokens)
        self.calibrated = {a: costs.round_s(a.head, a.context, a.chains) for a in self.arms}
        shape = lambda h: (h.total_tokens, h.depth, h.top_k) if h else (0, 0, 0)  # noqa: E731
        self._order = sorted(self.arms, key=lambda a: (shape(a.head), a.context, a.chains))
        # per arm, in _order: the positions of the largest drafting arms it covers (the last
        # one is the arm its gain is over), and how many times deeper its head is than theirs
        # when that is all it adds (see _prior)
        self._rows: list[tuple[Arm, ArmStats, float, list[tuple[int, float | None]]]] = []
        self._by_option: dict[tuple[int, int], list[tuple[Arm, ArmStats, Arm | None]]] = {}
        for i, arm in enumerate(self._order):
            inside = [b for b in self._order[:i] if b.drafts and arm.covers(b)]
            largest = [b for b in inside if not any(c != b and c.covers(b) for c in inside)]
            covered = [(self._order.index(b), _growth(b, arm)) for b in largest]
            self._rows.append((arm, self.stats[arm], self.calibrated[arm], covered))
            below = largest[-1] if largest else None
            option = self._by_option.setdefault((arm.context, arm.chains), [])
            option.append((arm, self.stats[arm], below))
        self.ratio = FadingMean(mean=1.0)  # real / calibrated round time
        self.hit = False  # the last round's context candidate held its first token
        self._pending: list[_Pending] = []  # rounds whose drafts the text has not decided
        # the longest chains and most of them that any arm carries: what a round looks up
        self.context_request = (max(a.context for a in arms), max(a.chains for a in arms))
        self._random = random.Random(seed)

    @classmethod
    def for_decoding(
        cls, costs: CostModel, sampled: bool, has_head: bool, drafts: DraftSources = "both"
    ) -> TreePolicy:
        """The arms of one kind of decoding: top-k trees, or chains when sampling."""
        heads = [None]
        if has_head and drafts != "context":
            heads += head_menu(costs, SAMPLED_SHAPES if sampled else HEAD_SHAPES)
        contexts = [(0, 0)] + (list(CONTEXT_OPTIONS) if drafts != "head" else [])
        return cls(costs, [Arm(h, c, k) for h in heads for c, k in contexts])

    # ---- choosing ------------------------------------------------------------------------
    def choose(self, candidates: bool = True) -> Arm:
        """The arm with the most tokens per second, both drawn ``luck`` standard deviations
        off their posterior means (more tokens, fewer seconds); without context ``candidates``
        only arms without context drafts."""
        luck, ratio = self._random.gauss(0.0, 1.0), self.ratio.mean
        best, best_speed = self.arms[0], 0.0
        for (arm, stats, calibrated, _), tokens in zip(
            self._rows, self._tokens(luck, candidates, self.hit)
        ):
            seed = calibrated * ratio
            centre, deviation = stats.seconds.posterior(seed, 0.0)
            speed = tokens / max(centre - deviation * luck, seed / 10)
            if speed > best_speed:
                best, best_speed = arm, speed
        return best

    def tokens(self, arm: Arm, hit: bool | None = None) -> float:
        """The arm's expected tokens per round after a context hit or miss (default: as after
        the last round)."""
        return self._tokens(0.0, True, self.hit if hit is None else hit)[self._order.index(arm)]

    def seconds(self, arm: Arm) -> float:
        """The arm's expected seconds per round (its posterior mean)."""
        return self.stats[arm].seconds.posterior(self.calibrated[arm] * self.ratio.mean, 0.0)[0]

    def _tokens(self, luck: float, candidates: bool, hit: bool) -> list[float]:
        """Every arm's tokens per round in ``_order``, its gain drawn ``luck`` standard
        deviations off its posterior mean (0 for context arms without ``candidates``: only
        context arms cover them, so none of those runs)."""
        known: list[float] = []  # posterior means, built up from the small arms
        drawn: list[float] = []
        for arm, stats, _, covered in self._rows:
            if not arm.drafts or (arm.context and not candidates):
                known.append(float(not arm.drafts))  # the plain step: one token, surely
                drawn.append(known[-1])
                continue
            floor = max((known[small] for small, _ in covered), default=0.0)
            base = known[covered[-1][0]] if covered else 0.0
            prior = _prior(arm, covered, known) - base
            centre, deviation = stats.gains[hit and arm.context > 0].posterior(prior, PRIOR_SPREAD)
            known.append(max(base + centre, floor))
            drawn.append(max(base + centre + deviation * luck, floor))
        return drawn

    # ---- learning ------------------------------------------------------------------------
    def observe(
        self,
        arm: Arm,
        replayed: dict[TreeConfig | None, int | Drafted | None],
        candidates: list[tuple[int, ...]],
        text: Sequence[int],
        start: int,
        seconds: float | None,
    ) -> None:
        """One round: its time (None: no lesson on time), the head replays, and the context
        candidates that the text from ``start`` on will score (context arms run only on rounds
        with candidates, so they learn from those alone)."""
        if seconds is not None:
            self.stats[arm].seconds.add(seconds)
            self.ratio.add(seconds / self.calibrated[arm])
        for _, stats, _, covered in self._rows:  # those that cover none learn on most rounds
            for mean in stats.gains if covered else ():
                mean.count *= 1.0 - FORGET
        options = set(self._by_option) if candidates else {(0, 0)}
        self._pending.append(_Pending(start, candidates, replayed, self.hit, options))
        self.hit = bool(candidates) and len(text) > start and text[start] == candidates[0][0]
        self.settle(text)

    def settle(self, text: Sequence[int], final: bool = False) -> None:
        """Teach each arm a pending round's outcome once the text has decided its head drafts
        and its context candidates as far as its chains reach (``final``: the reply ended, take
        what the text shows). Its reference covers fewer of them, so is decided by then too."""
        for pending in self._pending:
            if not decide(pending.replayed, text, pending.start, final):
                continue
            for option in [
                o for o in pending.options if pending.context(*o, text, final) is not None
            ]:
                for arm, stats, below in self._by_option[option]:
                    tokens = pending.accepted(arm, text, final)
                    base = pending.accepted(below, text, final) if below else 0.0
                    if tokens is not None and base is not None:
                        stats.gains[pending.hit and arm.context > 0].add(tokens - base)
                pending.options.discard(option)
        self._pending = [pending for pending in self._pending if pending.options]

    # ---- what it learned, kept across launches (backend/services/tuning_cache.py) --------
    def learned(self) -> dict:
        means = lambda *m: [v for mean in m for v in (mean.count, mean.mean, mean.spread)]  # noqa: E731
        arms = {a.label(): means(s.seconds, *s.gains) for a, s in self.stats.items()}
        return {"arms": arms, "ratio": means(self.ratio)}

    def restore(self, data: dict, with_times: bool = True) -> None:
        """Take up what ``learned`` saved for the arms on offer now; ``with_times`` False when
        the costs were timed again (the saved seconds belong to another calibration). Raises
        ValueError, KeyError or TypeError on data of another form, before changing anything."""
        saved = {str(name): [float(v) for v in values] for name, values in data["arms"].items()}
        ratio = FadingMean(*(float(v) for v in data["ratio"]))
        if any(len(values) != 9 for values in saved.values()):
            raise ValueError("tuning state of another form")
        for arm, stats in self.stats.items():  # in place: the rows above hold them
            values = saved.get(arm.label())
            if values is not None:
                stats.seconds = FadingMean(*values[:3]) if with_times else FadingMean()
                stats.gains = (FadingMean(*values[3:6]), FadingMean(*values[6:]))
        if with_times:
            self.ratio = ratio


def _prior(arm: Arm, covered: list[tuple[int, float | None]], known: list[float]) -> float:
    """The arm's prior mean: the most that the drafting arms it covers accept (``known``),
    grown to its head's depth when it only deepens theirs; else PRIOR_ACCEPT per draft."""
    best = 0.0
    for small, growth in covered:
        best = max(best, 1.0 + (known[small] - 1.0) * growth if growth else known[small])
    return best or 1.0 + sum(PRIOR_ACCEPT**d for d in range(1, arm.depth + 1))


def _growth(small: Arm, big: Arm) -> float | None:
    """How many times deeper ``big``'s head is than ``small``'s when that is all it adds."""
    if small.head is None or (small.context, small.chains) != (big.context, big.chains):
        return None
    return big.head.depth / small.head.depth
