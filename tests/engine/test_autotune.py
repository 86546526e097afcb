"""The round auto-tuner (a bandit) as pure logic on hand-made cost models and simulated drafts; no
timing in tests. ``GPU_LIKE`` is an assumption about GPUs (verification nearly flat in the
number of tokens), not a measurement: docs/tuning.md says so."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from backend.config import TreeConfig
from backend.engine.autotune import (
    CONTEXT_OPTIONS,
    HEAD_SHAPES,
    MAX_ROUND_COST,
    SAMPLED_SHAPES,
    WINDOW,
    Arm,
    TreePolicy,
    head_menu,
)
from backend.engine.calibration import MEASURED_SIZES, CostModel
from tests.engine.helpers import make_runner, run
from tests.factories import easy_llama_pair, tiny_head, tiny_target

GPU_LIKE = CostModel({n: 0.010 + 0.00002 * n for n in MEASURED_SIZES}, draft_step_s=0.0008)
CPU_LIKE = CostModel({n: 0.005 * (1 + 0.25 * (n - 1)) for n in MEASURED_SIZES}, draft_step_s=0.0005)
CHAIN6 = TreeConfig(total_tokens=7, depth=6, top_k=1)


class World:
    """Simulated rounds. Per level of the head's tree the first guess holds with ``first``,
    else each later guess with ``later``; a shape accepts a level when one of its guesses there
    holds (about (N - 1) / D guesses a level, at most K). The context's candidate is the text
    itself while ``repeating`` (all of it accepted), else tokens never written. Round times are
    the calibrated ones: the tests check the choice, not the clock."""

    def __init__(self, policy: TreePolicy, first: float, later: float = 0.0, seed: int = 0):
        self.policy, self.first, self.later = policy, first, later
        self.rng = random.Random(seed)
        self.stream = [self.rng.randrange(1000) for _ in range(20_000)]  # what will be written
        self.text = self.stream[:10]
        self.repeating = False
        self.tokens = 0.0
        self.seconds = 0.0

    def accepted(self, shape: TreeConfig, ranks: list[int | None]) -> int:
        guesses = max(1.0, min(float(shape.top_k), (shape.total_tokens - 1) / shape.depth))
        count = 0
        for rank in ranks[: shape.depth]:
            if rank is None or rank >= guesses:
                break
            count += 1
        return count

    def round(self) -> Arm:
        policy = self.policy
        arm = policy.choose()
        ranks: list[int | None] = []
        for _ in range(8):
            rank = 0 if self.rng.random() < self.first else None
            for later_rank in range(1, 10):
                if rank is None and self.rng.random() < self.later:
                    rank = later_rank
            ranks.append(rank)
        covered = [s for s in policy.heads if arm.head is not None and covers(arm.head, s)]
        replayed = {None: 0, **{s: self.accepted(s, ranks) for s in covered}}
        start = len(self.text)
        future = self.stream[start : start + 33]
        candidate = tuple(future[:32]) if self.repeating else tuple([-1] * 32)
        context = min(arm.context, 32 if self.repeating else 0)
        gained = 1 + max(replayed.get(arm.head, 0), context)
        self.text += future[:gained]
        seconds = policy.calibrated[arm]
        self.tokens += gained
        self.seconds += seconds
        policy.observe(arm, replayed, [candidate], self.text, start, seconds)
        return arm

    def run(self, rounds: int) -> list[Arm]:
        return [self.round() for _ in range(rounds)]


def covers(big: TreeConfig, small: TreeConfig) -> bool:
    from backend.engine.replay import covers as replay_covers

    return replay_covers(big, small)


def head_policy(costs: CostModel, sampled: bool = False) -> TreePolicy:
    return TreePolicy.for_decoding(costs, sampled, has_head=True, drafts="head")


def commonest(arms: list[Arm]) -> Arm:
    return Counter(arms).most_common(1)[0][0]


# ---- the arms on offer ----------------------------------------------------------------------


def test_the_menu_offers_wide_trees_only_where_verification_is_cheap() -> None:
    gpu, cpu = head_menu(GPU_LIKE, HEAD_SHAPES), head_menu(CPU_LIKE, HEAD_SHAPES)
    assert gpu == list(HEAD_SHAPES)
    plain = CPU_LIKE.round_s(None)
    assert cpu == [s for s in HEAD_SHAPES if CPU_LIKE.round_s(s) <= MAX_ROUND_COST * plain]
    assert TreeConfig(total_tokens=5, depth=4, top_k=1) in cpu
    assert CHAIN6 not in cpu and TreeConfig(total_tokens=60, depth=7, top_k=10) not in cpu


def test_the_arms_follow_the_draft_sources_and_the_head() -> None:
    both = TreePolicy.for_decoding(GPU_LIKE, sampled=False, has_head=True, drafts="both")
    assert len(both.arms) == (1 + len(HEAD_SHAPES)) * (1 + len(CONTEXT_OPTIONS))
    assert Arm() in both.arms and Arm(CHAIN6) in both.arms and Arm(CHAIN6, 32, 1) in both.arms
    head = head_policy(GPU_LIKE)
    assert all(arm.context == 0 for arm in head.arms)
    for policy in (
        TreePolicy.for_decoding(GPU_LIKE, sampled=False, has_head=True, drafts="context"),
        TreePolicy.for_decoding(GPU_LIKE, sampled=False, has_head=False, drafts="both"),
    ):
        assert {arm.head for arm in policy.arms} == {None}
        assert len(policy.arms) == 1 + len(CONTEXT_OPTIONS)
        assert policy.context_request == (32, 2)
    sampled = head_policy(GPU_LIKE, sampled=True)
    assert {arm.head for arm in sampled.arms} == {None, *SAMPLED_SHAPES}
    assert all(shape.top_k == 1 for shape in SAMPLED_SHAPES)


# ---- what it learns to choose ---------------------------------------------------------------


def test_flat_gpu_costs_and_second_guesses_that_hold_pick_a_large_tree() -> None:
    world = World(head_policy(GPU_LIKE), first=0.85, later=0.5)
    chosen = world.run(300)[-100:]
    assert commonest(chosen).head.total_tokens >= 24


def test_steep_cpu_costs_pick_a_small_tree_or_a_chain() -> None:
    world = World(head_policy(CPU_LIKE), first=0.9, later=0.2)
    chosen = world.run(300)[-100:]
    assert commonest(chosen).head.total_tokens <= 12


@pytest.mark.parametrize("costs", [CPU_LIKE, GPU_LIKE], ids=["cpu", "gpu"])
@pytest.mark.parametrize("first", [0.6, 0.9])
def test_it_settles_within_5_percent_of_the_best_fixed_arm(costs, first) -> None:
    """The tuner's tokens per second over its rounds (exploration included) against the best
    arm's expected speed, priced in the same simulated world."""
    world = World(head_policy(costs), first=first, later=0.3)
    world.run(400)
    learned = world.tokens / world.seconds
    best = 0.0
    for arm in world.policy.arms:  # each arm's speed alone, from a world of its own
        fixed = World(head_policy(costs), first=first, later=0.3)  # the same rounds
        fixed.policy.choose = lambda arm=arm: arm  # type: ignore[method-assign]
        fixed.run(400)
        best = max(best, fixed.tokens / fixed.seconds)
    assert learned >= 0.95 * best, (learned, best)


def test_a_head_that_never_holds_runs_plain_steps() -> None:
    world = World(head_policy(CPU_LIKE), first=0.0)
    chosen = world.run(200)
    assert sum(arm == Arm() for arm in chosen[-100:]) >= 95
    plain_speed = 1.0 / CPU_LIKE.round_s(None)
    assert world.tokens / world.seconds >= 0.95 * plain_speed


def test_drafts_that_always_hold_reach_a_deep_arm_within_a_few_rounds() -> None:
    world = World(head_policy(GPU_LIKE), first=1.0)
    depths = [arm.depth for arm in world.run(12)]
    assert min(depths[4:]) >= 6, depths


def test_one_bad_round_of_a_deep_chain_does_not_shut_it_out() -> None:
    """A deep arm learns only from the rounds it runs; the arms it covers learn from every one.
    Its estimate never falls below theirs, so a bad first round is outlived."""
    policy = head_policy(GPU_LIKE)  # where deep arms pay
    deepest = max((s for s in policy.heads if s.top_k == 1), key=lambda s: s.depth)
    nothing = {None: 0, **{s: 0 for s in policy.heads if covers(deepest, s)}}
    policy.observe(Arm(deepest), nothing, [], [1, 2, 3], 3, policy.calibrated[Arm(deepest)])
    world = World(policy, first=0.97)
    chosen = world.run(150)  # second guesses never hold: the deepest chain is the best arm
    assert sum(arm == Arm(deepest) for arm in chosen[-50:]) >= 20, Counter(chosen[-50:])


@pytest.mark.parametrize("hard_rounds", [30, 60, 100])
def test_arms_shut_out_by_a_hard_stretch_come_back_when_the_text_gets_easy(hard_rounds) -> None:
    """Deep chains that lost on hard text must not stay out once their drafts hold (cheap chain
    steps make them the best arms then): their gains, learned on the hard text, fade until
    they are tried again."""
    flat = CostModel(
        {n: 0.005 * (1 + 0.02 * n) for n in MEASURED_SIZES},
        draft_step_s=0.0006,
        chain_step_s=0.00045,
    )
    for first, seed in [(first, seed) for first in (0.1, 0.3) for seed in range(6)]:
        world = World(head_policy(flat), first=first, later=0.2, seed=seed)
        world.run(hard_rounds)
        world.first = 0.9
        chosen = commonest(world.run(400)[-200:])
        assert chosen.head.top_k == 1 and chosen.depth >= 6, (first, seed, chosen.label())


def test_context_drafts_drop_out_when_they_stop_holding_and_come_back() -> None:
    """Text that repeats for a while between stretches that do not: context drafts join within
    a few rounds of each repetition and leave within a few rounds after it."""
    policy = TreePolicy.for_decoding(CPU_LIKE, sampled=False, has_head=True, drafts="both")
    world = World(policy, first=0.5)
    world.run(30)
    for _ in range(2):
        world.repeating = True
        repeating = world.run(20)
        assert all(arm.context > 0 for arm in repeating[3:]), [a.label() for a in repeating]
        world.repeating = False
        stopped = world.run(20)
        assert all(arm.context == 0 for arm in stopped[3:]), [a.label() for a in stopped]


def test_without_a_head_context_drafts_alone_run_and_back_off_to_plain() -> None:
    policy = TreePolicy.for_decoding(CPU_LIKE, sampled=False, has_head=False)
    world = World(policy, first=0.0)
    world.run(20)
    world.repeating = True
    assert all(arm.context > 0 for arm in world.run(20)[5:])
    world.repeating = False
    assert all(arm == Arm() for arm in world.run(20)[3:])


# ---- its estimates --------------------------------------------------------------------------


def test_a_round_teaches_only_the_arms_its_head_shape_covers() -> None:
    policy = head_policy(GPU_LIKE)
    tree = TreeConfig(total_tokens=16, depth=5, top_k=4)
    replayed = {None: 0, **{s: min(3, s.depth) for s in policy.heads if covers(tree, s)}}
    policy.observe(Arm(tree), replayed, [], [], 0, 0.01)

    def gain(arm: Arm):
        return policy.stats[arm].gains[0]

    def chain(depth: int) -> Arm:
        return Arm(TreeConfig(total_tokens=depth + 1, depth=depth, top_k=1))

    assert gain(chain(1)).mean == 2.0  # covers no drafting arm: all it accepts
    assert gain(chain(2)).mean == 1.0 and gain(chain(3)).mean == 1.0  # one more than inside
    assert gain(chain(4)).mean == 0.0 and gain(Arm(tree)).mean == 0.0  # no more than inside
    assert gain(Arm(tree)).count == 1 and gain(Arm()).mean == 1.0
    assert gain(Arm(CHAIN6)).count == 0  # depth 6 > 5: not covered
    assert policy.stats[Arm(tree)].seconds.count == 1
    assert policy.stats[Arm()].seconds.count == 0
    assert policy.tokens(Arm(tree)) >= policy.tokens(chain(3)) > policy.tokens(chain(2))


def test_an_arm_not_run_follows_the_arms_inside_it() -> None:
    """A gain is learned only on the rounds that cover the arm; between them, its estimate
    moves with the arms inside it, which learn from every round."""
    policy = head_policy(GPU_LIKE)
    deep, inside = Arm(CHAIN6), Arm(TreeConfig(total_tokens=4, depth=3, top_k=1))

    def rounds(verified: TreeConfig, accepted: int, count: int) -> None:
        covered = [s for s in policy.heads if covers(verified, s)]
        for _ in range(count):
            replayed = {None: 0, **{s: min(accepted, s.depth) for s in covered}}
            policy.observe(Arm(verified), replayed, [], [], 0, None)

    rounds(CHAIN6, 6, 8)  # easy text, on the deep chain
    deep_before, inside_before = policy.tokens(deep), policy.tokens(inside)
    rounds(inside.head, 1, WINDOW)  # hard text, on a chain of 3
    assert 0 < policy.stats[deep].gains[0].count < 8  # its 8 rounds, fading since
    assert deep_before - policy.tokens(deep) >= inside_before - policy.tokens(inside) > 1.0
    assert policy.tokens(deep) >= policy.tokens(inside)


def test_context_candidates_are_scored_once_the_text_decides() -> None:
    policy = TreePolicy.for_decoding(GPU_LIKE, sampled=False, has_head=False)
    text = [1, 2, 3]
    policy.observe(Arm(), {None: 0}, [(4, 5, 6, 7)], text, start=3, seconds=0.01)
    assert policy.stats[Arm(None, 4, 2)].gains[0].count == 0  # nothing written after it yet
    text += [4, 5]
    policy.settle(text)
    assert policy.stats[Arm(None, 4, 2)].gains[0].count == 0  # 4 and 5 match: 6 may follow
    text += [9]
    policy.settle(text)
    assert policy.stats[Arm(None, 4, 2)].gains[0].mean == 3.0  # two held, plus one
    assert policy.tokens(Arm()) == 1.0
    policy.observe(Arm(), {None: 0}, [(8, 8)], text, start=len(text), seconds=0.01)
    policy.settle(text, final=True)  # the reply ended: what the text showed (nothing)
    assert policy.stats[Arm(None, 4, 2)].gains[0].count == 2


def test_context_arms_run_and_learn_only_on_rounds_with_candidates() -> None:
    """Without candidates a context arm drafts what its head alone drafts: its rounds would
    price it as cheap as that and teach nothing about what its context drafts are worth."""
    alone = TreePolicy.for_decoding(CPU_LIKE, sampled=False, has_head=False)  # no head
    assert all(alone.choose(candidates=False) == Arm() for _ in range(100))
    assert any(alone.choose(candidates=True).context for _ in range(100))
    policy = TreePolicy.for_decoding(CPU_LIKE, sampled=False, has_head=True, drafts="both")
    text = [1, 2, 3, 4]
    replayed = {None: 0, **{s: 1 for s in policy.heads}}
    policy.observe(Arm(), replayed, [], text, start=4, seconds=0.01)
    policy.settle(text + [5, 6], final=True)
    assert policy.stats[Arm(policy.heads[0])].gains[0].count == 1
    assert all(policy.stats[arm].gains[0].count == 0 for arm in policy.arms if arm.context)


def test_an_arm_not_run_is_priced_by_calibration_times_the_machines_ratio() -> None:
    policy = head_policy(CPU_LIKE)
    tree = TreeConfig(total_tokens=4, depth=3, top_k=1)
    assert policy.seconds(Arm(tree)) == pytest.approx(CPU_LIKE.round_s(tree))
    for _ in range(WINDOW):
        policy.observe(Arm(), {None: 0}, [], [], 0, 1.5 * CPU_LIKE.round_s(None))
    assert policy.seconds(Arm()) == pytest.approx(1.5 * CPU_LIKE.round_s(None))
    assert policy.seconds(Arm(tree)) == pytest.approx(1.5 * CPU_LIKE.round_s(tree))


def test_means_fade_after_a_window_of_rounds() -> None:
    policy = head_policy(GPU_LIKE)
    first = policy.heads[0]  # one draft
    for accepted in [0] * 100 + [1] * WINDOW:
        policy.observe(Arm(first), {None: 0, first: accepted}, [], [], 0, None)
    mean = policy.stats[Arm(first)].gains[0]
    assert mean.count == WINDOW and 1.5 < mean.mean < 2.0


def test_the_choice_is_reproducible_for_a_seed() -> None:
    first = [arm.label() for arm in World(head_policy(CPU_LIKE), first=0.7).run(50)]
    again = [arm.label() for arm in World(head_policy(CPU_LIKE), first=0.7).run(50)]
    assert first == again


# ---- what it keeps across launches ----------------------------------------------------------


def test_what_it_learned_round_trips_and_times_can_be_left_out() -> None:
    world = World(head_policy(CPU_LIKE), first=0.8)
    world.run(60)
    saved = world.policy.learned()
    restored = head_policy(CPU_LIKE)
    restored.restore(saved)
    assert restored.stats == world.policy.stats and restored.ratio == world.policy.ratio
    fresh_times = head_policy(CPU_LIKE)
    fresh_times.restore(saved, with_times=False)
    assert all(s.seconds.count == 0 for s in fresh_times.stats.values())
    assert {a: s.gains for a, s in fresh_times.stats.items()} == {
        a: s.gains for a, s in world.policy.stats.items()
    }


def test_state_of_another_form_changes_nothing() -> None:
    policy = head_policy(CPU_LIKE)
    before = dict(policy.stats)
    for damaged in ({"arms": {"plain": [1.0] * 6}, "ratio": [1, 1, 0]}, {"arms": {}}, {}):
        with pytest.raises((ValueError, KeyError, TypeError)):
            policy.restore(damaged)
    assert policy.stats == before


# ---- in the engine ----------------------------------------------------------------------------


def test_auto_with_a_useless_head_is_mostly_plain_and_exact(monkeypatch) -> None:
    # the rounds' wall times on a shared machine would decide between arms this close; here
    # the costs and the drafts alone must
    observe = TreePolicy.observe
    monkeypatch.setattr(
        TreePolicy, "observe", lambda self, arm, *args: observe(self, arm, *args[:-1], None)
    )
    target = tiny_target("llama", num_layers=8)
    runner, drafter = make_runner(target, tiny_head("eagle1", target))
    prompt = [5, 17, 33, 2, 90, 41]
    auto = TreeConfig(auto=True)
    eagle, rounds = run(
        runner,
        drafter,
        prompt,
        mode="eagle",
        max_new_tokens=80,
        tree=auto,
        costs=CPU_LIKE,
        drafts="head",
    )
    vanilla, _ = run(runner, drafter, prompt, mode="vanilla", max_new_tokens=80)
    assert eagle.token_ids == vanilla.token_ids
    plain = sum(1 for r in rounds[1:] if r.tree_size == 1)
    assert plain > 0.7 * eagle.rounds
    assert "rarely accepted" in eagle.hint and "fell back to plain decoding" in eagle.hint


def test_auto_with_a_good_head_drafts_and_is_exact() -> None:
    target, head = easy_llama_pair()
    runner, drafter = make_runner(target, head)
    prompt = [1, 2, 3, 4]
    eagle, rounds = run(
        runner,
        drafter,
        prompt,
        mode="eagle",
        max_new_tokens=60,
        tree=TreeConfig(auto=True),
        costs=CPU_LIKE,
    )
    vanilla, _ = run(runner, drafter, prompt, mode="vanilla", max_new_tokens=60)
    assert eagle.token_ids == vanilla.token_ids
    assert eagle.tau > 2.0
    shapes = dict(eagle.tree_shapes)
    assert sum(r.num_accepted_drafts for r in rounds) > 0
    assert sum(shapes.values()) == eagle.rounds
    assert all(r.tree_shape for r in rounds[1:])
