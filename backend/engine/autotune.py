"""Tree-size choice from measured costs and measured acceptance (issue: speed on every device).

Expected speed of a tree shape = expected tokens per round / expected seconds per round, where
- seconds per round = the shape's whole round as timed at load (calibration.py), corrected by
  how long its real rounds take;
- tokens per round = 1 + sum_{d=1..D} prod_{j<=d} r_j, with r_j the conditional acceptance
  rate at depth j (exponential moving average over recent rounds), widened by what each
  sibling rank adds when the guesses before it failed.
Plain decoding (no drafting) is one of the candidates: when drafts keep failing (a head that
does not fit, a high temperature) the policy falls back to it, so EAGLE never runs much slower
than vanilla, and after a growing number of plain steps it probes again with the shape it would
draft with.
On CPUs verifying many nodes costs several single steps, so small trees win; on GPUs the cost
is nearly flat and large trees win: the same rule picks both from the timings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from backend.config import TreeConfig
from backend.engine.calibration import CostModel
from backend.engine.replay import covers, replay_accepted
from backend.engine.round_times import TimeScales, shape_name
from backend.engine.tree import DraftTree
from backend.engine.verify import Acceptance

# Candidate shapes (total_tokens incl. root, depth, top_k), small to large.
LADDER: tuple[TreeConfig, ...] = tuple(
    TreeConfig(total_tokens=n, depth=d, top_k=k)
    for n, d, k in (
        (2, 1, 1),
        (3, 2, 1),
        (4, 3, 1),
        (5, 4, 1),
        (6, 5, 1),
        (7, 6, 1),
        (8, 7, 1),
        (9, 8, 1),
        (6, 3, 2),
        (8, 4, 2),
        (10, 5, 2),
        (12, 5, 3),
        (16, 5, 4),
        (16, 5, 10),
        (16, 6, 3),
        (24, 6, 4),
        (32, 6, 6),
        (32, 6, 8),
        (48, 7, 8),
        (60, 7, 10),
    )
)
# Sampled drafts (temperature > 0) are drawn as chains (drafter.py). A second chain beside the
# first mostly re-draws what the first covered; on the CPU demo pair it measured slower at the
# same acceptance (numbers in the README, "Tree auto-tuning"), so the policy chooses among chains.
SAMPLED_LADDER: tuple[TreeConfig, ...] = tuple(
    TreeConfig(total_tokens=d + 1, depth=d, top_k=1) for d in range(1, 9)
)
PRIOR_RATE = 0.5  # conditional acceptance assumed before any observation
PRIOR_WEIGHT = 2.0  # the prior counts as this many rounds, so the first rounds teach fast
EMA = 0.07  # weight of the newest round in the acceptance estimates, once past those
PRIOR_NEXT = 0.5  # chance the guess of rank i (second = 1) holds once the earlier ones failed,
# assumed as PRIOR_NEXT / i: later guesses share what probability the first ones left
LONG_EMA = 0.01  # the same estimates over a long memory, which the short ones return to while
RETURN = 0.05  # drafting is off, by this share per plain step (else they stay at the values of
# the unlucky rounds that switched it off, which the rare probes mend only slowly)
SETTLED = 1e-4  # a return step smaller than this in every rate leaves the last choice standing
MIN_EVIDENCE = 6  # drafted rounds seen before plain steps may win: one or two unlucky rounds
# of a head that pays must not switch drafting off (it then learns only from rare probes)
MAX_GUESSES = max(tree.top_k for tree in LADDER)  # siblings per node, at most
FIRST_PROBE_AFTER = 8  # plain steps before re-trying drafts; doubles up to MAX_PROBE_GAP
MAX_PROBE_GAP = 64
CLOSE_PROBE_GAP = 3  # plain steps between probes when drafting would pay at acceptance rates
# one standard error above the estimates (a close call: the estimates may be unlucky)
REPRICE_EVERY = 4  # rounds between pricings of every shape, once SETTLE_AFTER rounds were seen
SETTLE_AFTER = 16
SCOUT_EVERY = 16  # rounds between verifications of a shape one size up (see TreePolicy.choose)
MAX_SCOUT_GAP = 64  # that gap doubles up to this while the choice stands from scout to scout
MODEL_WEIGHT = 3.0  # the per-depth model counts as this many rounds of a shape's own replays
REPLAY_WINDOW = 20.0  # rounds a shape's replayed mean rests on at most (older ones fade)
WIDTH_PRIOR = 3.0  # a branching shape's width correction starts at 1 with this many rounds
STALL = 1.5  # a round's time teaches at most this factor off the expected (observe_time)


_UNKNOWN = object()


@dataclass
class TreePolicy:
    """Per-generation choice of the next round's tree (None = a plain step, no drafting).

    Two estimates of a shape's tokens per round, blended as the second accumulates:
    - a model: per depth, how often the head's first guess is the target's token, and per
      sibling rank, how often that guess holds it once the earlier ones failed (from the rank
      of every accepted or rejected sibling), so that width is priced from what second and
      third guesses actually buy, not from what a tenth guess buys;
    - the shape's own replays (replay.py): every verified tree tells what each shape it covers
      would have accepted on the same text.
    A branching shape's model estimate is scaled by what its replays accepted against what the
    model promised for them (``width_fit``), which outlasts the replays themselves.
    Every SCOUT_EVERY rounds (up to MAX_SCOUT_GAP while the choice stands) the policy verifies
    the cheapest shape covering its choice, wider and deeper by turns, so that bigger shapes get
    measured too; a scout still accepts at least what the choice would have, so looking costs
    only its extra verification time. Chains run to depth 8 so that looking deeper than a
    chain costs one head step and one verified token, not a wide tree."""

    costs: CostModel
    ladder: tuple[TreeConfig, ...] = LADDER  # SAMPLED_LADDER for temperature > 0
    rates: list[float] = field(default_factory=lambda: [PRIOR_RATE] * 8)  # first-guess hits
    long_rates: list[float] = field(default_factory=lambda: [PRIOR_RATE] * 8)
    seen: list[int] = field(default_factory=lambda: [0] * 8)  # rounds that reached each level
    # per rank past the first guess (second, third, ...): fading counts of the times it was
    # wrong and of the times it was tried, each once the guesses before it had failed
    tails: list[tuple[float, float]] = field(default_factory=lambda: _prior_tails())
    long_tails: list[tuple[float, float]] = field(  # the same counts over a long memory
        default_factory=lambda: _prior_tails()
    )
    # Per shape, over the rounds that replayed it (fading sums, so they follow the text): its
    # tokens, the tokens of the one-draft shape on the same rounds, and the rounds counted.
    # Paired with the same rounds, the ratio of the two sums compares shapes on the same text.
    measured: dict[TreeConfig, tuple[float, float, float]] = field(default_factory=dict)
    reference_tokens: float = 1.0 + PRIOR_RATE  # tokens/round of the one-draft shape, lately
    # Per branching shape, over the rounds that replayed it (fading sums): its tokens and the
    # model's estimate for it at the time. The model spreads a tree's guesses evenly over its
    # depths; a real tree puts nodes where the head is unsure, not always on the path the
    # target takes, so the ratio corrects the model where it stands in for missing replays.
    width_fit: dict[TreeConfig, tuple[float, float]] = field(default_factory=dict)
    time_scale: TimeScales = field(default_factory=TimeScales)
    plain_steps: int = 0
    probe_gap: int = FIRST_PROBE_AFTER
    rounds_since_scout: int = 0
    scout_gap: int = SCOUT_EVERY
    scouts: int = 0
    _scouted_from: TreeConfig | None = field(default=None, repr=False)  # the choice last scouted
    probes: int = 0  # close-call probes so far
    observed_levels: int = 0  # depths whose outcome some round has shown (the rest are guessed)
    _best: object = field(default=None, repr=False)  # cached choice; _UNKNOWN after observe
    _stale: bool = field(default=False, repr=False)  # estimates moved since it was made
    _unpriced: int = field(default=0, repr=False)  # rounds since it was made
    # modelled tokens by depth per guesses a level, from the present rates (modelled_tokens)
    _curves: dict[float, list[float]] = field(default_factory=dict, repr=False)
    _tails_now: list[float] = field(default_factory=list, repr=False)  # tail_rates() for them

    def __post_init__(self) -> None:
        self._best = _UNKNOWN

    @classmethod
    def for_decoding(cls, costs: CostModel, sampled: bool) -> TreePolicy:
        """A policy over the shapes the drafter builds: top-k trees, or chains when sampling."""
        return cls(costs, ladder=SAMPLED_LADDER if sampled else LADDER)

    # ---- what it learned, kept across launches (backend/services/tuning_cache.py) ----------
    def learned(self) -> dict:
        """The estimates as JSON-ready data (not the round counters of this session), copied:
        a snapshot that later rounds leave as it is (the lesson restores one)."""
        return {
            "rates": list(self.rates),
            "long_rates": list(self.long_rates),
            "seen": list(self.seen),
            "tails": [list(counts) for counts in self.tails],
            "long_tails": [list(counts) for counts in self.long_tails],
            "measured": {shape_name(s): list(sums) for s, sums in self.measured.items()},
            "reference_tokens": self.reference_tokens,
            "width_fit": {shape_name(s): list(sums) for s, sums in self.width_fit.items()},
            "observed_levels": self.observed_levels,
            "time_scale": {
                "shapes": {shape_name(s): f for s, f in self.time_scale.shapes.items()},
                "families": dict(self.time_scale.families),
                "drafting": self.time_scale.drafting,
                "overall": self.time_scale.overall,
                "rounds": dict(self.time_scale.rounds),
            },
        }

    def restore(self, data: dict, with_times: bool = True) -> None:
        """Take up what ``learned`` saved (shapes off this ladder are dropped). ``with_times``
        False keeps the time factors fresh: they are relative to the costs they were learned
        against, so costs timed again make them meaningless. Raises ValueError (or KeyError,
        TypeError) on data of another form, before changing anything."""
        shapes = {shape_name(s): s for s in self.ladder}

        def sums(saved: dict) -> dict:
            return {shapes[n]: tuple(map(float, v)) for n, v in saved.items() if n in shapes}

        rates, long_rates = list(map(float, data["rates"])), list(map(float, data["long_rates"]))
        seen = list(map(int, data["seen"]))
        tails = [tuple(map(float, counts)) for counts in data["tails"]]
        long_tails = [tuple(map(float, counts)) for counts in data["long_tails"]]
        if {len(rates), len(long_rates), len(seen)} != {len(self.rates)} or {
            len(tails),
            len(long_tails),
        } != {len(self.tails)}:
            raise ValueError("tuning state of another form")
        if any(len(counts) != 2 or counts[1] <= 0 for counts in tails + long_tails):
            raise ValueError("tuning state of another form")
        times = data["time_scale"]
        time_scale = TimeScales(
            shapes={shapes[n]: float(f) for n, f in times["shapes"].items() if n in shapes},
            families={str(k): float(f) for k, f in times["families"].items()},
            drafting=None if times["drafting"] is None else float(times["drafting"]),
            overall=None if times["overall"] is None else float(times["overall"]),
            rounds={str(k): int(n) for k, n in times["rounds"].items()},
        )
        measured, width_fit = sums(data["measured"]), sums(data["width_fit"])
        reference, levels = float(data["reference_tokens"]), int(data["observed_levels"])
        self.rates, self.long_rates, self.seen = rates, long_rates, seen
        self.tails, self.long_tails = tails, long_tails  # type: ignore[assignment]
        self.measured, self.width_fit = measured, width_fit  # type: ignore[assignment]
        self.reference_tokens, self.observed_levels = reference, levels
        if with_times:
            self.time_scale = time_scale
        self._best = _UNKNOWN
        self._curves.clear()

    def discount(self, rounds: float) -> None:
        """Let what was learned so far count as at most ``rounds`` rounds of evidence, so that
        the next rounds overrule it quickly where they disagree: for a lesson on other text than
        the user's (services/tuner_lesson.py), whose rates would otherwise hold the first real
        replies on shapes that their text does not pay for."""
        self.seen = [min(seen, int(rounds)) for seen in self.seen]
        self.tails = [_at_most(counts, rounds) for counts in self.tails]
        self.long_tails = [_at_most(counts, rounds) for counts in self.long_tails]
        for shape, (tokens, reference, weight) in self.measured.items():
            keep = min(1.0, rounds / weight) if weight > 0 else 1.0
            self.measured[shape] = (keep * tokens, keep * reference, keep * weight)
            if shape in self.width_fit:
                fit_tokens, promised = self.width_fit[shape]
                self.width_fit[shape] = (keep * fit_tokens, keep * promised)
        self._best = _UNKNOWN
        self._curves.clear()

    def begin_request(self) -> None:
        """A new prompt is new text: if drafting was switched off, probe on its first round
        rather than carrying the old reply's back-off into it."""
        self.plain_steps = self.probe_gap

    # ---- choosing ------------------------------------------------------------------------
    def choose(self) -> TreeConfig | None:
        self._unpriced += 1
        if self._best is _UNKNOWN or (self._stale and self._unpriced >= REPRICE_EVERY):
            self._best = self.best_tree()
            self._stale, self._unpriced = False, 0
        best = self._best
        if best is not None:
            self.plain_steps = 0
            self.probe_gap = FIRST_PROBE_AFTER
            return self.scout(best) if self._scout_due(best) else best
        self.plain_steps += 1
        self._return_to_long_run()
        if self.plain_steps >= self.probe_gap:  # look again: the text may have become easy
            self.plain_steps = 0
            return self.probe()
        return None

    def _scout_due(self, best: TreeConfig) -> bool:
        """Whether this round scouts. Scouts come less often while the choice stays near the
        last scouted one (the same shape, or a chain one level off: chains of 5 and 6 flip with
        the estimates and look at the same shapes), since a scout round pays its extra
        verification and teaches little once the estimates agree; another choice brings the
        short gap back at once."""
        last = self._scouted_from
        near = last is not None and (
            best == last or (best.top_k == last.top_k == 1 and abs(best.depth - last.depth) <= 1)
        )
        if not near:
            self.scout_gap = SCOUT_EVERY
        self.rounds_since_scout += 1
        if self.rounds_since_scout < self.scout_gap:
            return False
        if near:
            self.scout_gap = min(2 * self.scout_gap, MAX_SCOUT_GAP)
        self.rounds_since_scout, self._scouted_from = 0, best
        return True

    def probe(self) -> TreeConfig:
        """The shape that would run if drafts paid: its round teaches the depths and ranks that
        decide whether they do (a single draft would only teach the first guess). Sets when
        the next probe comes."""
        probe = self.best_drafting_tree()
        hopeful = self.modelled_tokens(probe, self.hopeful_rates()) * self.width_correction(probe)
        hopeful /= self.round_s(probe)
        if hopeful < 1.0 / self.round_s(None):  # worse even if luck was against it: look
            self.probe_gap = min(self.probe_gap * 2, MAX_PROBE_GAP)  # less and less often
            return probe
        # a close call on estimates from few rounds: keep looking at the same pace, every other
        # time through a shape that covers it, wider or deeper (what it does not teach)
        self.probe_gap = CLOSE_PROBE_GAP
        self.probes += 1
        return self.scout(probe) if self.probes % 2 == 0 else probe

    def _estimates_moved(self) -> None:
        """The cached choice is priced again at once while the first rounds teach fast, then
        every REPRICE_EVERY rounds: pricing every shape each round costs a visible share of a
        small model's round, and one round moves the estimates little."""
        if self.seen[0] < SETTLE_AFTER:
            self._best = _UNKNOWN
        else:
            self._stale = True

    def _return_to_long_run(self) -> None:
        moved = 0.0
        for level, long_rate in enumerate(self.long_rates):
            step = RETURN * (long_rate - self.rates[level])
            self.rates[level] += step
            moved = max(moved, abs(step))
        for index, ((wrong, tried), (long_wrong, long_tried)) in enumerate(
            zip(self.tails, self.long_tails)
        ):
            step = RETURN * (tried * long_wrong / long_tried - wrong)
            self.tails[index] = (wrong + step, tried)
            moved = max(moved, abs(step) / tried)
        if moved > SETTLED:  # else the cached choice stands: no need to price every shape again
            self._best = _UNKNOWN
            self._curves.clear()

    def best_tree(self) -> TreeConfig | None:
        """The shape with the most expected tokens per second (None: a plain step)."""
        tree = self.best_drafting_tree()
        if self.seen[0] < MIN_EVIDENCE:
            return tree
        return tree if self.speed(tree) > 1.0 / self.round_s(None) else None

    def best_drafting_tree(self) -> TreeConfig:
        return max(self.ladder, key=self.speed)  # the first of equals: the smallest

    def speed(self, tree: TreeConfig) -> float:
        """Expected tokens per second of rounds of ``tree``."""
        return self.expected_tokens(tree) / self.round_s(tree)

    def scout(self, best: TreeConfig) -> TreeConfig:
        """The cheapest other shape that covers ``best``, wider and deeper by turns (a chain's
        replays say nothing about second guesses, a shallow tree's nothing about depth), and
        every third turn from a branching choice the best chain: replays price a chain's
        tokens, but only its own rounds time it (chains skip the tree bookkeeping, so priced
        like the trees' rounds they look dearer than they run, and would never be tried)."""
        bigger = [t for t in self.ladder if t != best and covers(t, best)]
        chains = [t for t in self.ladder if t.top_k == 1] if best.top_k > 1 else []
        if not bigger and not chains:
            return best
        self.scouts += 1
        if chains and (self.scouts % 3 == 0 or not bigger):
            return max(chains, key=self.speed)
        if self.scouts % (3 if best.top_k > 1 else 2) == 1:
            turn = [t for t in bigger if t.top_k > best.top_k]
        else:
            turn = [t for t in bigger if t.depth > best.depth]
        return min(turn or bigger, key=lambda t: (self.round_s(t), -t.top_k, -t.total_tokens))

    def round_s(self, tree: TreeConfig | None) -> float:
        """Calibrated seconds of a round of ``tree``, corrected by how long such rounds really
        took (drafting bookkeeping and Python overhead that one forward's timing misses): the
        shape's own ratio once it ran, else its family's (plain, chain, tree), else that of all
        rounds (a plain step not taken for a while pays the same overheads as the rest)."""
        return self.costs.round_s(tree) * self.time_scale.of(tree)

    def observe_time(self, tree: TreeConfig | None, seconds: float) -> None:
        """Learn from one real round's wall time (drafting, verification and bookkeeping). A
        round far off what is expected of it (a stall of the machine) teaches only up to
        STALL times the expectation: taken whole, one stall among the first rounds set the
        machine's ratio so high that the shapes first timed then kept their price for good
        (only plain steps pin the ratio, and a head that pays runs none)."""
        expected = self.time_scale.of(tree)
        ratio = seconds / self.costs.round_s(tree)
        ratio = min(max(ratio, expected / STALL, 0.5), expected * STALL, 4.0)
        self.time_scale.observe(tree, ratio)
        self._estimates_moved()

    def expected_tokens(self, tree: TreeConfig) -> float:
        """The model's estimate, overruled by the shape's own replays as they add up (one lucky
        or unlucky round must not decide)."""
        modelled = self.modelled_tokens(tree)
        modelled *= self.width_correction(tree, modelled)
        tokens, reference, weight = self.measured.get(tree, (0.0, 1.0, 0.0))
        replayed = self.reference_tokens * tokens / reference
        return (weight * replayed + MODEL_WEIGHT * modelled) / (weight + MODEL_WEIGHT)

    def width_correction(self, tree: TreeConfig, modelled: float | None = None) -> float:
        """What a branching shape's rounds accepted against what the model promised for them
        (1 for chains, which the per-depth rates model exactly); ``modelled`` is the model's
        present estimate for ``tree`` when the caller has it."""
        if tree.top_k == 1:
            return 1.0
        tokens, promised = self.width_fit.get(tree, (0.0, 0.0))
        prior = WIDTH_PRIOR * (self.modelled_tokens(tree) if modelled is None else modelled)
        return (tokens + prior) / (promised + prior)

    def hopeful_rates(self) -> list[float]:
        """Each depth's first-guess rate one standard error up, from the rounds it rests on."""
        hopeful = []
        for rate, seen in zip(self.rates, self.seen):
            rounds = min(seen, 1.0 / EMA) + PRIOR_WEIGHT
            hopeful.append(min(1.0, rate + (rate * (1.0 - rate) / rounds) ** 0.5))
        return hopeful

    def modelled_tokens(self, tree: TreeConfig, rates: list[float] | None = None) -> float:
        """1 + sum over depths of the chance that every level so far held the target's token
        among the guesses a node of this shape gets (about (N - 1) / D of them, at most K)."""
        guesses = max(1.0, min(float(tree.top_k), (tree.total_tokens - 1) / tree.depth))
        if rates is not None:
            return _token_curve(guesses, rates, self.tail_rates())[tree.depth]
        if not self._curves:  # the estimates changed: the tails too
            self._tails_now = self.tail_rates()
        if guesses not in self._curves:  # shapes with as many guesses a level share one
            self._curves[guesses] = _token_curve(guesses, self.rates, self._tails_now)
        return self._curves[guesses][tree.depth]

    def tail_rates(self) -> list[float]:
        """Per rank past the first, the chance that guess is wrong once the earlier ones were;
        never below the rank before it (a later guess is not likelier right), which also lets
        ranks seldom tried borrow from those tried often."""
        rates, floor = [], 0.0
        for wrong, tried in self.tails:
            floor = max(floor, wrong / tried)
            rates.append(floor)
        return rates

    # ---- learning ------------------------------------------------------------------------
    def observe_verified(self, shape: TreeConfig, tree: DraftTree, acceptance: Acceptance) -> None:
        """Learn from a verified round: replays of the shapes it covers and, per level, the
        rank of the guess that held the target's token (or how many guesses all failed)."""
        replayed, outcomes = None, None
        if tree.ranks is not None and acceptance.correct is not None:
            shapes = self.covered_shapes(shape)
            replayed = dict(zip(shapes, replay_accepted(tree, acceptance.correct, shapes)))
            outcomes = rank_outcomes(tree, acceptance)
        self.observe(shape, acceptance.num_accepted_drafts, replayed, outcomes)

    def observe(
        self,
        tree: TreeConfig,
        accepted: int,
        replayed: dict[TreeConfig, int] | None = None,
        outcomes: list[tuple[int | None, int]] | None = None,
    ) -> None:
        """Learn from ``accepted`` drafts of ``tree``, what each covered shape would have
        accepted (``replayed``; a chain's prefixes are known exactly) and, per reached level,
        (rank of the accepted guess or None, guesses tried) (``outcomes``; default: a chain)."""
        self._estimates_moved()
        if replayed is None:
            replayed = self.chain_replay(tree, accepted) if tree.top_k == 1 else {tree: accepted}
        reference = 1.0 + min(accepted, 1)  # what one draft would have given this round
        fade = 1.0 - 1.0 / REPLAY_WINDOW
        for shape in self.measured.keys() - replayed.keys():  # not seen this round: its
            tokens, ref_sum, weight = self.measured[shape]  # replays grow stale, the model
            self.measured[shape] = (fade * tokens, fade * ref_sum, fade * weight)  # takes over
        for shape, drafts in replayed.items():
            tokens, ref_sum, weight = self.measured.get(shape, (0.0, 0.0, 0.0))
            self.measured[shape] = (
                fade * tokens + 1.0 + drafts,
                fade * ref_sum + reference,
                fade * weight + 1.0,
            )
            if shape.top_k > 1:  # the model's promise before this round's lesson
                tokens, promised = self.width_fit.get(shape, (0.0, 0.0))
                self.width_fit[shape] = (
                    fade * tokens + 1.0 + drafts,
                    fade * promised + self.modelled_tokens(shape),
                )
        self.reference_tokens += EMA * (reference - self.reference_tokens)
        if outcomes is None:
            outcomes = [(0, 1)] * min(accepted, tree.depth)
            outcomes += [(None, 1)] if accepted < tree.depth else []
        self._observe_ranks(outcomes, deepest=accepted >= tree.depth, depth=tree.depth)

    def chain_replay(self, tree: TreeConfig, accepted: int) -> dict[TreeConfig, int]:
        """A chain's shorter prefixes accept exactly the first drafts it accepted."""
        return {
            shape: min(accepted, shape.depth)
            for shape in self.ladder
            if shape.top_k == 1 and covers(tree, shape)
        }

    def covered_shapes(self, tree: TreeConfig) -> list[TreeConfig]:
        """The shapes whose outcome a verification of ``tree`` tells (itself included)."""
        return [shape for shape in self.ladder if covers(tree, shape)] or [tree]

    def _observe_ranks(
        self, outcomes: list[tuple[int | None, int]], deepest: bool, depth: int
    ) -> None:
        self._curves.clear()
        fade = 1.0 - EMA
        for level, (rank, guesses) in enumerate(outcomes):
            if level < len(self.rates):
                hit = 1.0 if rank == 0 else 0.0
                # a mean over the prior and the rounds so far, a fading average after that
                mean = 1.0 / (self.seen[level] + 1.0 + PRIOR_WEIGHT)
                self.rates[level] += max(EMA, mean) * (hit - self.rates[level])
                self.long_rates[level] += max(LONG_EMA, mean) * (hit - self.long_rates[level])
                self.seen[level] += 1
            # past the first guess: ranks 1..rank were tried, all but the last wrong; or all
            # the level's guesses were tried and wrong
            last = min(guesses - 1 if rank is None else rank, len(self.tails))
            for index in range(last):
                missed = rank is None or index + 1 < rank
                self.tails[index] = _count(self.tails[index], missed, fade)
                self.long_tails[index] = _count(self.long_tails[index], missed, 1.0 - LONG_EMA)
        self.observed_levels = max(self.observed_levels, len(outcomes))
        if deepest:  # the whole depth was accepted: deeper may well pay too
            self.probe_gap = FIRST_PROBE_AFTER  # and if this was a probe, look again soon
            top = self.rates[min(depth, len(self.rates)) - 1]
            # only depths never observed are guessed from the last one; an observed depth keeps
            # what it showed (else every full round would revive a depth where drafts fail)
            for level in range(max(depth, self.observed_levels), len(self.rates)):
                self.rates[level] = max(self.rates[level], top)


def _token_curve(guesses: float, rates: list[float], tails: list[float]) -> list[float]:
    """Modelled tokens per round at every depth (index = depth) for ``guesses`` guesses a level,
    from the first-guess ``rates`` per depth and the ``tails`` (TreePolicy.tail_rates)."""
    later_wrong = 1.0  # chance that every guess past the first fails too
    for rank, wrong in enumerate(tails, start=1):
        later_wrong *= wrong ** min(max(guesses - rank, 0.0), 1.0)
    curve, reach = [1.0], 1.0
    for first in rates:
        reach *= min(1.0 - (1.0 - first) * later_wrong, 0.99)
        curve.append(curve[-1] + reach)
    return curve


def _prior_tails() -> list[tuple[float, float]]:
    """(wrong, tried) per rank past the first: PRIOR_NEXT / rank right, as PRIOR_WEIGHT tries."""
    return [
        (PRIOR_WEIGHT * (1.0 - PRIOR_NEXT / rank), PRIOR_WEIGHT) for rank in range(1, MAX_GUESSES)
    ]


def _at_most(counts: tuple[float, float], tries: float) -> tuple[float, float]:
    """(wrong, tried) counts with the same odds, resting on at most ``tries`` tries."""
    wrong, tried = counts
    keep = min(1.0, tries / tried)
    return keep * wrong, keep * tried


def _count(counts: tuple[float, float], missed: bool, keep: float) -> tuple[float, float]:
    """Fading (wrong, tried) counts after one more try."""
    wrong, tried = counts
    return keep * wrong + missed, keep * tried + 1.0


def rank_outcomes(tree: DraftTree, acceptance: Acceptance) -> list[tuple[int | None, int]]:
    """Per level of the accepted path: the sibling rank of the accepted node (None if none was)
    and how many guesses that level held."""
    children = tree.children()
    ranks = tree.ranks.tolist()
    outcomes, node = [], 0
    for accepted in acceptance.accepted_nodes:
        outcomes.append((ranks[accepted], len(children[node])))
        node = accepted
    if children[node]:
        outcomes.append((None, len(children[node])))
    return outcomes
