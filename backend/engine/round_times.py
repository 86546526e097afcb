"""How long real rounds take against their calibrated cost, per shape and family: the factors the
tree auto-tuner (autotune.py) prices every shape with, so that a shared CPU's drift and the
bookkeeping a one-forward timing misses both reach its choice."""

from __future__ import annotations

from dataclasses import dataclass, field

from backend.config import TreeConfig

TIME_EMA = 0.15  # weight of the newest round in the machine's time ratio (a shared CPU drifts)
SHAPE_TIME_EMA = TIME_EMA / 4  # a shape's time relative to the machine's is learned slower than the
# machine's own ratio, so that a drift while one shape runs moves the machine's, not the shape's
SHAPE_TIME_PRIOR = 3.0  # a shape's own factor starts from its family's as this many rounds


def _fade(old: float | None, new: float, rate: float = TIME_EMA) -> float:
    return new if old is None else old + rate * (new - old)


def _learn(old: float | None, prior: float, new: float, rounds: int) -> float:
    """A time factor after one more round: the mean of ``prior`` (as SHAPE_TIME_PRIOR rounds)
    and the rounds so far, a fading average once that many rounds weigh less than its rate.
    Taking the first round whole let one noisy round set a shape's price for dozens more."""
    start = prior if old is None else old
    return start + max(SHAPE_TIME_EMA, 1.0 / (rounds + 1.0 + SHAPE_TIME_PRIOR)) * (new - start)


@dataclass
class TimeScales:
    """Real round time / calibrated round time, as the machine's ratio ``overall`` (a fading
    average over all rounds of what each implies, given its shape's factor) times a factor per
    drafting shape and family (chain, tree): the extra work of drafting rounds that calibration
    misses. A plain step is the reference (factor 1), so that while only plain steps run, a
    slower or faster machine carries over to the drafting shapes instead of leaving them at the
    speed they had when they last ran."""

    shapes: dict[TreeConfig | None, float] = field(default_factory=dict)
    families: dict[str, float] = field(default_factory=dict)
    drafting: float | None = None  # the factor over all drafting rounds, whatever their family
    overall: float | None = None
    # rounds each factor rests on: a shape's starts from its family's, a family's from the
    # drafting rounds', theirs from 1 (calibration right), each weighing SHAPE_TIME_PRIOR rounds
    rounds: dict[str, int] = field(default_factory=dict)  # by shape_name(shape), family, "drafting"

    def of(self, tree: TreeConfig | None) -> float:
        """The machine's ratio times the shape's own factor once it ran, else its family's, else
        that of the drafting rounds seen (a family never run shares their bookkeeping; a
        factor of 1 would price it as if it had none, against the family that ran)."""
        return (self.overall or 1.0) * self.relative(tree)

    def relative(self, tree: TreeConfig | None) -> float:
        if tree is None:
            return 1.0
        return (
            self.shapes.get(tree) or self.families.get(shape_family(tree)) or self.drafting or 1.0
        )

    def observe(self, tree: TreeConfig | None, ratio: float) -> None:
        # the machine's ratio as this round implies it, given what is known of its shape
        self.overall = _fade(self.overall, ratio / self.relative(tree))
        if tree is None:
            return
        relative = ratio / self.overall
        family, name = shape_family(tree), shape_name(tree)
        drafting, family_factor = self.drafting or 1.0, self.families.get(family)
        shape_prior = family_factor or drafting
        self.shapes[tree] = self._learned(name, self.shapes.get(tree), shape_prior, relative)
        self.families[family] = self._learned(family, family_factor, drafting, relative)
        self.drafting = self._learned("drafting", self.drafting, 1.0, relative)

    def _learned(self, key: str, old: float | None, prior: float, new: float) -> float:
        rounds = self.rounds.get(key, 0)
        self.rounds[key] = rounds + 1
        return _learn(old, prior, new, rounds)


def shape_name(tree: TreeConfig) -> str:
    return f"{tree.total_tokens}/{tree.depth}/{tree.top_k}"


def shape_family(tree: TreeConfig | None) -> str:
    if tree is None:
        return "plain"
    return "chain" if tree.top_k == 1 else "tree"
