"""Tree auto-tuning as pure logic on hand-made cost models (no timing in tests)."""

from __future__ import annotations

import random

import pytest

from backend.config import TreeConfig
from backend.engine.autotune import (
    CLOSE_PROBE_GAP,
    FIRST_PROBE_AFTER,
    LADDER,
    MAX_SCOUT_GAP,
    MIN_EVIDENCE,
    REPRICE_EVERY,
    SCOUT_EVERY,
    SETTLE_AFTER,
    STALL,
    TreePolicy,
)
from backend.engine.calibration import MEASURED_SIZES, CostModel
from backend.engine.replay import covers
from tests.engine.helpers import make_runner, run
from tests.factories import easy_llama_pair, tiny_head, tiny_target

GPU_LIKE = CostModel({n: 0.010 + 0.00002 * n for n in MEASURED_SIZES}, draft_step_s=0.0008)
CPU_LIKE = CostModel({n: 0.005 * (1 + 0.25 * (n - 1)) for n in MEASURED_SIZES}, draft_step_s=0.0005)


def trained(
    policy: TreePolicy,
    accept_rate: float,
    rounds: int = 40,
    scouted: list[tuple[int, TreeConfig]] | None = None,
) -> TreePolicy:
    """Feed rounds in which each depth is accepted with probability ``accept_rate`` whatever
    the width (so every shape the verified one covers accepts the same drafts, up to its depth).
    ``scouted`` collects (round index, shape) of the rounds that scouted."""
    rng = random.Random(0)
    for index in range(rounds):
        scouts_before, tree = policy.scouts, policy.choose() or LADDER[0]
        if scouted is not None and policy.scouts > scouts_before:
            scouted.append((index, tree))
        accepted = 0
        while accepted < tree.depth and rng.random() < accept_rate:
            accepted += 1
        replayed = {s: min(accepted, s.depth) for s in policy.covered_shapes(tree)}
        policy.observe(tree, accepted, replayed)
    return policy


def test_flat_gpu_costs_and_good_drafts_pick_a_large_tree() -> None:
    # a good head whose second and third guesses hold too (in a world where width bought
    # nothing, a chain would rightly win); shapes are compared by their own replayed rounds,
    # so this takes a few replies' worth
    policy = TreePolicy(GPU_LIKE)
    ranked_world(policy, rank_odds=0.2, rounds=160)
    tree = policy.best_tree()
    assert tree is not None and tree.total_tokens >= 24


def test_steep_cpu_costs_pick_a_small_tree() -> None:
    tree = trained(TreePolicy(CPU_LIKE), 0.9).best_tree()
    assert tree is not None and tree.total_tokens <= 12


def test_drafts_that_always_hold_reach_a_deep_tree_within_a_few_rounds() -> None:
    # The first message after load runs on what the first rounds teach: the prior must give
    # way to them quickly, not at the pace of the long-run fading average.
    policy = TreePolicy(CPU_LIKE)
    depths = []
    for _ in range(10):
        tree = policy.choose()
        assert tree is not None
        depths.append(tree.depth)
        policy.observe(tree, tree.depth, {s: s.depth for s in policy.covered_shapes(tree)})
    assert max(depths[:10]) >= 5, depths


def test_failing_drafts_back_off_to_plain_steps_and_probe_with_growing_gaps() -> None:
    policy = trained(TreePolicy(CPU_LIKE), 0.0, rounds=10)
    choices = []
    for _ in range(FIRST_PROBE_AFTER * 7):
        tree = policy.choose()
        choices.append(tree)
        if tree is not None:
            policy.observe(tree, 0)
    probes = [i for i, tree in enumerate(choices) if tree is not None]
    assert probes, "never probed again"
    assert len(probes) <= 3
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert all(later > earlier for earlier, later in zip(gaps, gaps[1:]))
    assert choices.count(None) > 0.9 * len(choices)


def test_recovers_when_drafts_become_good() -> None:
    policy = trained(TreePolicy(CPU_LIKE), 0.0, rounds=10)
    assert sum(policy.choose() is None for _ in range(5)) >= 4  # backed off (maybe one probe)
    for _ in range(8 * FIRST_PROBE_AFTER):  # probes now succeed fully
        tree = policy.choose()
        if tree is not None:
            policy.observe(tree, tree.depth)
    assert policy.choose() is not None


def test_auto_tree_with_useless_head_is_mostly_plain_and_exact(monkeypatch) -> None:
    # Rounds' wall times would correct the hand-made costs by how busy this machine is; that
    # lesson has its own tests, and here the costs and the drafts alone must decide.
    monkeypatch.setattr(TreePolicy, "observe_time", lambda self, tree, seconds: None)
    target = tiny_target("llama", num_layers=8)
    runner, drafter = make_runner(target, tiny_head("eagle1", target))
    prompt = [5, 17, 33, 2, 90, 41]
    auto = TreeConfig(auto=True)
    eagle, rounds = run(
        runner, drafter, prompt, mode="eagle", max_new_tokens=80, tree=auto, costs=CPU_LIKE
    )
    vanilla, _ = run(runner, drafter, prompt, mode="vanilla", max_new_tokens=80)
    assert eagle.token_ids == vanilla.token_ids
    plain = sum(1 for r in rounds[1:] if r.tree_size == 1)
    assert plain > 0.8 * eagle.rounds
    assert "rarely accepted" in eagle.hint and "fell back to plain decoding" in eagle.hint


def test_auto_tree_with_a_good_head_drafts_and_is_exact() -> None:
    target, head = easy_llama_pair()
    runner, drafter = make_runner(target, head)
    prompt = [1, 2, 3, 4]
    eagle, rounds = run(
        runner,
        drafter,
        prompt,
        mode="eagle",
        max_new_tokens=100,
        tree=TreeConfig(auto=True),
        costs=CPU_LIKE,
    )
    vanilla, _ = run(runner, drafter, prompt, mode="vanilla", max_new_tokens=100)
    assert eagle.token_ids == vanilla.token_ids
    assert eagle.tau > 2.0
    assert all(r.tree_size > 1 for r in rounds[1:])


def test_cheap_chain_steps_make_chains_win_when_branching_costs_more() -> None:
    """Chains draft without tree bookkeeping; when their measured step is cheaper the cost
    model charges them less, and with steep verification a chain is chosen."""
    costs = CostModel(CPU_LIKE.verify_s, draft_step_s=0.0015, chain_step_s=0.0004)
    chain, tree = TreeConfig(6, 5, 1), TreeConfig(6, 3, 2)
    assert costs.round_s(chain) == costs.verify(6) + 5 * 0.0004
    assert costs.round_s(tree) == costs.verify(6) + 3 * 0.0015
    cheap = trained(TreePolicy(costs), 0.85).best_tree()
    assert cheap is not None and cheap.top_k == 1
    dear = CostModel(CPU_LIKE.verify_s, draft_step_s=0.0015, chain_step_s=0.0015)
    costly = trained(TreePolicy(dear), 0.85).best_tree()
    assert costly is None or costly.depth <= cheap.depth  # dearer steps never draft deeper


def test_sampled_policy_only_considers_chains() -> None:
    """Even with flat GPU-like costs, where top-k trees grow to 32-60 nodes, a policy for
    sampled drafts picks a chain, as deep as the acceptance pays for."""
    from backend.engine.autotune import SAMPLED_LADDER

    assert all(t.top_k == 1 and t.total_tokens == t.depth + 1 for t in SAMPLED_LADDER)
    deep = trained(TreePolicy(GPU_LIKE, ladder=SAMPLED_LADDER), 0.95).best_tree()
    shallow = trained(TreePolicy(CPU_LIKE, ladder=SAMPLED_LADDER), 0.6).best_tree()
    assert deep is not None and deep in SAMPLED_LADDER and deep.depth >= 6
    assert shallow is None or shallow.depth < deep.depth


def test_a_new_request_probes_at_once_after_a_back_off() -> None:
    policy = trained(TreePolicy(CPU_LIKE), 0.0, rounds=12)
    while (tree := policy.choose()) is not None:  # let a pending probe fail: the loop ends
        policy.observe(tree, 0)  # on a plain step, backed off within the old reply
    policy.begin_request()
    assert policy.choose() == LADDER[0]  # the new prompt gets a probe on its first round
    policy.observe(LADDER[0], 0)
    assert policy.choose() is None  # a failed probe keeps the back-off


def ranked_world_round(rng: random.Random, rank_odds: float) -> list[int]:
    """One round of a head whose guess list holds the target's token at rank r with
    probability (1 - rank_odds) * rank_odds**r, independently per depth (ranks per depth)."""
    ranks = []
    for _ in range(8):
        rank = 0
        while rng.random() < rank_odds:
            rank += 1
        ranks.append(rank)
    return ranks


def guesses(shape: TreeConfig) -> int:
    """Guesses per level along a path: at most K, and the shape's nodes spread over its depth."""
    return max(1, min(shape.top_k, (shape.total_tokens - 1) // shape.depth))


def accepted_in(shape: TreeConfig, ranks: list[int]) -> int:
    drafts = 0
    while drafts < shape.depth and ranks[drafts] < guesses(shape):
        drafts += 1
    return drafts


def true_speed(shape: TreeConfig | None, costs: CostModel, rank_odds: float) -> float:
    if shape is None:
        return 1.0 / costs.round_s(None)
    hit = 1.0 - rank_odds ** guesses(shape)
    tokens = 1.0 + sum(hit**d for d in range(1, shape.depth + 1))
    return tokens / costs.round_s(shape)


def ranked_world(policy: TreePolicy, rank_odds: float, rounds: int, seed: int = 1) -> None:
    """Feed rounds of the ranked world: each shape accepts what its guesses per level hold;
    the policy also sees the replays of covered shapes and the rank outcome per level."""
    rng = random.Random(seed)
    for _ in range(rounds):
        shape = policy.choose() or LADDER[0]
        ranks = ranked_world_round(rng, rank_odds)
        accepted, width = accepted_in(shape, ranks), guesses(shape)
        outcomes = [(ranks[d], width) for d in range(accepted)]
        outcomes += [(None, width)] if accepted < shape.depth else []
        replayed = {s: accepted_in(s, ranks) for s in policy.covered_shapes(shape)}
        policy.observe(shape, accepted, replayed, outcomes)


@pytest.mark.parametrize("rank_odds", [0.3, 0.5, 0.7])
@pytest.mark.parametrize("costs", [CPU_LIKE, GPU_LIKE], ids=["cpu", "gpu"])
def test_the_policy_settles_within_5_percent_of_the_best_shape(costs, rank_odds) -> None:
    """Heads of every quality (first guess right 70%, 50%, 30% of the time; later guesses
    right as often), on steep and flat costs: after a few replies' worth of rounds the chosen
    shape is within 5% of the best shape (or plain decoding) of this world."""
    policy = TreePolicy(costs)
    ranked_world(policy, rank_odds, rounds=200)
    best = max(true_speed(s, costs, rank_odds) for s in (*LADDER, None))
    chosen = policy.best_tree()
    assert true_speed(chosen, costs, rank_odds) >= 0.95 * best, chosen


def test_rank_outcomes_price_width() -> None:
    """A head whose second and third guesses are often right makes wide shapes look better
    than a head whose later guesses are rarely right, at the same first-guess rate."""
    often, rarely = TreePolicy(CPU_LIKE), TreePolicy(CPU_LIKE)
    for _ in range(60):
        often.observe(TreeConfig(16, 5, 4), 1, outcomes=[(1, 4), (None, 4)])
        rarely.observe(TreeConfig(16, 5, 4), 1, outcomes=[(0, 4), (None, 4)])
    wide, narrow = TreeConfig(16, 5, 10), TreeConfig(6, 5, 1)
    assert often.tail_rates()[0] < rarely.tail_rates()[0]
    gain_often = often.modelled_tokens(wide) / often.modelled_tokens(narrow)
    gain_rarely = rarely.modelled_tokens(wide) / rarely.modelled_tokens(narrow)
    assert gain_often > gain_rarely


def scout_rounds(policy: TreePolicy, best: TreeConfig, rounds: int) -> list[tuple[int, TreeConfig]]:
    """(round index, shape) of the rounds in the next ``rounds`` that did not verify ``best``."""
    picks = [policy.choose() for _ in range(rounds)]
    return [(index, pick) for index, pick in enumerate(picks) if pick != best]


def test_scouting_verifies_a_covering_shape_less_often_while_the_choice_stands() -> None:
    scouted: list[tuple[int, TreeConfig]] = []
    policy = trained(TreePolicy(CPU_LIKE), 0.7, rounds=8 * MAX_SCOUT_GAP, scouted=scouted)
    late = [(index, tree) for index, tree in scouted if index > 4 * MAX_SCOUT_GAP]
    best = policy.best_tree()
    assert late and all(covers(tree, best) and tree != best for _, tree in late)
    gaps = [later - earlier for (earlier, _), (later, _) in zip(scouted, scouted[1:])]
    assert gaps[0] == SCOUT_EVERY and gaps[-1] == MAX_SCOUT_GAP
    assert len(scouted) < 8 * MAX_SCOUT_GAP / SCOUT_EVERY / 2  # fewer than half as many


def test_another_choice_brings_the_short_scout_gap_back() -> None:
    policy = trained(TreePolicy(CPU_LIKE), 1.0, rounds=300)  # drafts always hold
    before = policy.best_tree()
    assert before is not None and before.top_k == 1 and policy.scout_gap == MAX_SCOUT_GAP
    scouts = 0
    for _ in range(MAX_SCOUT_GAP):  # the text turns hard: only the first draft holds
        scouts_before, tree = policy.scouts, policy.choose() or LADDER[0]
        if policy.scouts > scouts_before:
            scouts += 1
            assert covers(tree, policy.best_tree())
        policy.observe(tree, 1)
    after = policy.best_tree()
    assert after is not None and after.depth < before.depth - 1
    assert scouts >= 2  # at the old gap: one at most


def test_chains_look_deeper_than_a_chain_at_one_more_step() -> None:
    """Looking past a chain's depth through a wide tree verifies many tokens for one level's
    lesson; a chain one deeper covers the chain for one head step and one token more."""
    policy = trained(TreePolicy(CPU_LIKE), 0.95, rounds=200)
    best = policy.best_tree()
    assert best is not None and best.top_k == 1
    deeper = [shape for _, shape in scout_rounds(policy, best, 4 * MAX_SCOUT_GAP)]
    deeper = [shape for shape in deeper if shape.depth > best.depth]
    assert deeper and all(s == TreeConfig(best.depth + 2, best.depth + 1, 1) for s in deeper)


def test_every_third_scout_from_a_tree_times_the_best_chain() -> None:
    """Only a chain's own rounds tell what it costs to run; covering scouts never run one."""
    policy = TreePolicy(GPU_LIKE)
    ranked_world(policy, rank_odds=0.2, rounds=160)  # second and third guesses hold: trees win
    best = policy.best_tree()
    assert best is not None and best.top_k > 1
    scouts = [shape for _, shape in scout_rounds(policy, best, 4 * MAX_SCOUT_GAP)][:3]
    chains = [t for t in policy.ladder if t.top_k == 1]
    assert len(scouts) == 3 and scouts.count(max(chains, key=policy.speed)) == 1
    assert sum(covers(s, best) for s in scouts) == 2  # the other two: wider, deeper


def test_the_summary_and_each_round_name_the_verified_shapes() -> None:
    target, head = easy_llama_pair()
    runner, drafter = make_runner(target, head)
    summary, rounds = run(
        runner,
        drafter,
        [1, 2, 3, 4],
        mode="eagle",
        max_new_tokens=60,
        tree=TreeConfig(auto=True),
        costs=CPU_LIKE,
    )
    shapes = [r.tree_shape for r in rounds[1:]]
    assert all(shapes)
    assert dict(summary.tree_shapes) == {s: shapes.count(s) for s in set(shapes)}
    assert sum(n for _, n in summary.tree_shapes) == summary.rounds
    labels = {t.label() for t in LADDER} | {"plain"}
    assert set(shapes) <= labels


def test_real_round_times_correct_the_calibrated_costs() -> None:
    """When chains really take twice their calibrated time and trees what calibration said,
    the policy's costs follow the real rounds, per shape and for the shape's family."""
    policy = TreePolicy(CPU_LIKE)
    chain, tree = TreeConfig(7, 6, 1), TreeConfig(16, 5, 4)
    for _ in range(200):  # a shape's own factor is learned slowly (drift is learned fast)
        policy.observe_time(chain, 2.0 * CPU_LIKE.round_s(chain))
        policy.observe_time(tree, CPU_LIKE.round_s(tree))
    assert policy.round_s(chain) == pytest.approx(2.0 * CPU_LIKE.round_s(chain), rel=1e-3)
    assert policy.round_s(tree) == pytest.approx(CPU_LIKE.round_s(tree), rel=1e-3)
    other_chain = TreeConfig(4, 3, 1)  # never ran: its family's ratio applies
    assert policy.round_s(other_chain) == pytest.approx(
        2.0 * CPU_LIKE.round_s(other_chain), rel=1e-3
    )
    policy.observe_time(tree, 100.0)  # a stall counts as at most 4x
    assert policy.round_s(tree) <= 4.0 * CPU_LIKE.round_s(tree)


def test_a_stall_among_the_first_rounds_does_not_price_shapes_for_good() -> None:
    """The first timed round stalls (ten times its cost), then every round runs as calibrated
    and no plain step comes (drafting pays): a shape timed only during the stall, never again,
    is still priced near its calibrated cost, not at the machine's ratio of that moment."""
    policy = TreePolicy(CPU_LIKE)
    stalled, chain = TreeConfig(16, 6, 3), TreeConfig(7, 6, 1)
    policy.observe_time(stalled, 10.0 * CPU_LIKE.round_s(stalled))
    assert policy.round_s(stalled) <= STALL * CPU_LIKE.round_s(stalled) * 1.001
    for _ in range(200):
        policy.observe_time(chain, CPU_LIKE.round_s(chain))
    assert policy.round_s(chain) == pytest.approx(CPU_LIKE.round_s(chain), rel=0.02)
    assert policy.round_s(stalled) < 1.6 * CPU_LIKE.round_s(stalled)


def test_a_slower_machine_is_still_learned_past_the_stall_bound() -> None:
    """Every round now takes three times its calibrated cost: the bound slows the lesson but
    does not stop it."""
    policy = TreePolicy(CPU_LIKE)
    chain = TreeConfig(7, 6, 1)
    for _ in range(60):
        policy.observe_time(chain, 3.0 * CPU_LIKE.round_s(chain))
    assert policy.round_s(chain) == pytest.approx(3.0 * CPU_LIKE.round_s(chain), rel=0.05)


def test_one_noisy_round_of_a_shape_does_not_set_its_price() -> None:
    """Chains ran as calibrated for a while; then a chain of 5 runs once, 40% slow (noise, not
    a stall): its price moves a quarter of the way, not all of it, so that it is not shunned
    until dozens of rounds undo that one. Its rounds, if they really are that slow, still
    teach it all the way."""
    policy = TreePolicy(CPU_LIKE)
    chain, other = TreeConfig(7, 6, 1), TreeConfig(6, 5, 1)
    for _ in range(40):
        policy.observe_time(chain, CPU_LIKE.round_s(chain))
    policy.observe_time(other, 1.4 * CPU_LIKE.round_s(other))
    ratio = policy.round_s(other) / CPU_LIKE.round_s(other)
    assert 1.05 < ratio < 1.15
    for _ in range(200):
        policy.observe_time(other, 1.4 * CPU_LIKE.round_s(other))
        policy.observe_time(chain, CPU_LIKE.round_s(chain))
    assert policy.round_s(other) == pytest.approx(1.4 * CPU_LIKE.round_s(other), rel=0.02)


def test_settled_estimates_are_priced_every_few_rounds_not_every_round(monkeypatch) -> None:
    """Pricing every shape costs a visible share of a small model's round: once the first
    rounds have taught, the choice is priced again every REPRICE_EVERY rounds; before that,
    after every round."""
    policy = TreePolicy(CPU_LIKE)
    priced = []
    best_tree = policy.best_tree
    monkeypatch.setattr(policy, "best_tree", lambda: priced.append(1) or best_tree())
    chain = TreeConfig(7, 6, 1)
    for _ in range(SETTLE_AFTER):
        policy.observe(policy.choose() or chain, 3)
    assert len(priced) == SETTLE_AFTER
    priced.clear()
    rounds = 8 * REPRICE_EVERY
    for _ in range(rounds):
        shape = policy.choose() or chain
        policy.observe(shape, 3)
        policy.observe_time(shape, CPU_LIKE.round_s(shape))
    assert len(priced) == rounds // REPRICE_EVERY


def test_a_family_never_run_is_priced_like_the_drafting_rounds_seen() -> None:
    """Only trees ran, at 0.7 of their calibrated time against plain steps at 1.0 (calibration
    over-priced drafting rounds on this machine): a chain, never run, is priced at 0.7 too,
    not at 1.0, which would make chains look dearer than trees by calibration's error alone."""
    policy = TreePolicy(CPU_LIKE)
    tree, chain = TreeConfig(16, 6, 3), TreeConfig(7, 6, 1)
    for _ in range(200):
        policy.observe_time(tree, 0.7 * CPU_LIKE.round_s(tree))
        policy.observe_time(None, CPU_LIKE.round_s(None))
    assert policy.round_s(None) == pytest.approx(CPU_LIKE.round_s(None), rel=0.01)
    assert policy.round_s(chain) == pytest.approx(0.7 * CPU_LIKE.round_s(chain), rel=0.01)


def test_shapes_not_run_for_a_while_follow_the_machines_drift() -> None:
    """Trees ran as calibrated, then the machine got twice as slow while only plain steps
    ran: the trees' expected round time doubles too instead of keeping its old speed (which
    would make drafting look worse, or better, than it is when plain steps are compared)."""
    policy = TreePolicy(CPU_LIKE)
    tree = TreeConfig(8, 4, 2)
    for _ in range(30):
        policy.observe_time(tree, CPU_LIKE.round_s(tree))
        policy.observe_time(None, CPU_LIKE.round_s(None))
    for _ in range(60):
        policy.observe_time(None, 2.0 * CPU_LIKE.round_s(None))
    assert policy.round_s(None) == pytest.approx(2.0 * CPU_LIKE.round_s(None), rel=0.02)
    assert policy.round_s(tree) == pytest.approx(2.0 * CPU_LIKE.round_s(tree), rel=0.02)


def test_a_failing_tenth_guess_does_not_make_the_second_look_bad() -> None:
    """Each sibling rank has its own odds: a head whose second guess holds half the time its
    first fails, and whose later guesses never do, prices a 2-wide level from the second
    guess alone. One pooled ratio over all ranks would drown it in the wide trees' misses."""
    policy = TreePolicy(CPU_LIKE)
    wide = TreeConfig(16, 5, 10)
    for index in range(80):
        first = [(0, 10), (1, 10), (None, 10), (0, 10)][index % 4]
        policy.observe(wide, 0 if first[0] is None else 1, {wide: 0}, [first])
    tails = policy.tail_rates()
    assert tails[0] == pytest.approx(0.5, abs=0.1)
    assert tails[2] > 0.9
    assert all(later >= earlier for earlier, later in zip(tails, tails[1:]))


def test_two_unlucky_first_rounds_do_not_switch_drafting_off() -> None:
    """Once drafting is off, only rare probes teach; so a couple of failed rounds at the start
    (a partly right head has them) must not switch it off before enough rounds are seen."""
    policy = TreePolicy(CPU_LIKE)
    for _ in range(2):
        tree = policy.choose()
        assert tree is not None
        policy.observe(tree, 0)
    assert policy.choose() is not None
    for _ in range(MIN_EVIDENCE):  # a head that keeps failing is switched off after that
        policy.observe(policy.choose() or LADDER[0], 0)
    assert policy.best_tree() is None


def test_probes_after_a_back_off_verify_the_shape_drafting_would_use() -> None:
    """Drafts half right, but any drafted round costs so much more than a plain step here that
    plain steps win: the probe is the best drafting shape, whose round teaches several depths,
    not a single draft."""
    steep = CostModel({n: 0.005 * (1 + (n > 1) * (2 + 0.02 * n)) for n in MEASURED_SIZES}, 0.0005)
    policy = trained(TreePolicy(steep), 0.5)
    assert policy.best_tree() is None
    probes = [tree for tree in (policy.choose() for _ in range(2 * FIRST_PROBE_AFTER)) if tree]
    assert probes and probes[0] == policy.best_drafting_tree() and probes[0].depth > 1


def test_close_calls_are_probed_often_and_clear_losses_less_and_less() -> None:
    """Plain steps win on the estimates, but at acceptance rates one standard error up drafting
    would pay: the estimates may just be unlucky, so probes keep coming at a short, steady
    pace. A head whose drafts never hold is probed less and less often."""
    costs = CostModel({n: 0.005 * (1 + (n > 1) * (0.3 + 0.02 * n)) for n in MEASURED_SIZES}, 5e-4)
    close = trained(TreePolicy(costs), 0.45)
    assert close.best_tree() is None
    picks = [close.choose() for _ in range(8 * CLOSE_PROBE_GAP)]
    probes = [index for index, tree in enumerate(picks) if tree is not None]
    assert len(probes) >= 6 and {b - a for a, b in zip(probes, probes[1:])} == {CLOSE_PROBE_GAP}
    hopeless = TreePolicy(costs)
    for _ in range(12):  # every guess at every rank fails
        tree = hopeless.choose() or LADDER[0]
        failed = {shape: 0 for shape in hopeless.covered_shapes(tree)}
        hopeless.observe(tree, 0, failed, [(None, tree.top_k)])
    picks = [hopeless.choose() for _ in range(8 * FIRST_PROBE_AFTER)]
    probes = [index for index, tree in enumerate(picks) if tree is not None]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps and all(later > earlier for earlier, later in zip(gaps, gaps[1:]))


def test_estimates_return_to_the_long_run_while_drafting_is_off() -> None:
    """A bad stretch after a long good run switches drafting off; while it is off the short
    estimates drift back toward the long-run ones instead of staying where the bad stretch
    left them until rare probes mend them."""
    policy = trained(TreePolicy(CPU_LIKE), 0.6, rounds=200)
    for _ in range(40):  # nothing is accepted: the first level's guess fails every round
        tree = policy.choose() or LADDER[0]
        policy.observe(tree, 0, {shape: 0 for shape in policy.covered_shapes(tree)}, [(None, 1)])
        if policy.best_tree() is None:
            break
    low, long_run = policy.rates[0], policy.long_rates[0]
    assert low < long_run - 0.2 and policy.best_tree() is None
    for _ in range(30):  # plain steps only: what moves the estimates is the return alone
        assert policy.choose() is None or policy.plain_steps == 0
    assert abs(policy.rates[0] - long_run) < 0.5 * (long_run - low)


def test_the_first_drafted_round_after_plain_steps_is_not_timed(monkeypatch) -> None:
    """That round also runs the head over the tokens of the plain steps, a one-off the
    calibrated round costs leave out: learning its time would make drafting look slower than it
    is. The head's pass over the prompt runs before the first round, so that round is timed."""
    timed, chosen = [], []
    choose = TreePolicy.choose

    def spy_choose(self):
        chosen.append(choose(self))
        return chosen[-1]

    monkeypatch.setattr(TreePolicy, "choose", spy_choose)
    monkeypatch.setattr(TreePolicy, "observe_time", lambda self, tree, s: timed.append(tree))
    target = tiny_target("llama", num_layers=8)  # a useless head: plain steps, then probes
    runner, drafter = make_runner(target, tiny_head("eagle1", target))
    run(runner, drafter, [5, 17, 33, 2, 90, 41], mode="eagle", max_new_tokens=80, costs=CPU_LIKE)
    behind = [False] + [shape is None for shape in chosen[:-1]]
    expected = [s for s, late in zip(chosen, behind) if s is None or not late]
    assert chosen[0] is not None and timed[0] == chosen[0]
    assert timed == expected and len(expected) < len(chosen)


def test_full_rounds_do_not_keep_reviving_a_depth_where_drafts_fail() -> None:
    """A head right up to depth 6 and never beyond (trained on 6-step unrolls): after deeper
    shapes were seen to fail at depth 7, full depth-6 rounds must not raise the depth-7 rate
    again (extrapolation is for depths never observed), so depth 7 is not chosen. Flat (GPU)
    costs make deep trees cheap enough to tempt."""
    policy = TreePolicy(GPU_LIKE)
    rng = random.Random(3)
    deep_rounds = scouts_before = 0
    for index in range(400):
        shape = policy.choose() or LADDER[0]
        ranks = [0 if rng.random() < 0.95 else 1 for _ in range(6)] + [99, 99]
        accepted, width = accepted_in(shape, ranks), guesses(shape)
        outcomes = [(ranks[d], width) for d in range(accepted)]
        outcomes += [(None, width)] if accepted < shape.depth else []
        replayed = {s: accepted_in(s, ranks) for s in policy.covered_shapes(shape)}
        policy.observe(shape, accepted, replayed, outcomes)
        deep_rounds += index >= 200 and shape.depth > 6
        scouts_before = policy.scouts if index == 199 else scouts_before
    assert policy.rates[6] < 0.5  # what depth 7 showed, not the depth-6 rate copied down
    assert policy.best_tree().depth <= 6
    assert deep_rounds <= policy.scouts - scouts_before  # only scouts look deeper


def test_replays_of_a_shape_no_longer_verified_grow_stale() -> None:
    """A few unlucky early rounds of a deep chain must not pin its estimate once the text has
    changed: replays of shapes nothing verifies any more fade, and the per-depth model (which
    every round keeps current) takes over."""
    policy = TreePolicy(CPU_LIKE)
    chain6, chain3 = (TreeConfig(total_tokens=d + 1, depth=d, top_k=1) for d in (6, 3))
    for _ in range(3):
        policy.observe(chain6, 0)  # early: nothing accepted
    stuck = policy.expected_tokens(chain6)
    for _ in range(120):
        policy.observe(chain3, 3)  # later: every draft of the shorter chain accepted
    assert stuck < 2.0
    assert policy.expected_tokens(chain6) > 0.9 * policy.modelled_tokens(chain6) > 4.0


def test_a_tree_that_promised_more_than_it_accepted_stays_corrected() -> None:
    """The model spreads a tree's guesses evenly over its depths; a real tree spends nodes
    where the target does not go. Here the tree's three guesses are all at the first level
    (one guess deeper): what it accepted against what the model promised corrects its estimate,
    and the correction stays after its own replays have faded while a chain ran."""
    policy = TreePolicy(CPU_LIKE)
    tree, chain = TreeConfig(total_tokens=16, depth=6, top_k=3), LADDER[5]
    rng = random.Random(5)
    tokens = []
    for _ in range(60):
        ranks = ranked_world_round(rng, 0.4)
        accepted = 1 if ranks[0] < 3 else 0
        while accepted and accepted < tree.depth and ranks[accepted] == 0:
            accepted += 1
        widths = [3] + [1] * 5
        outcomes = [(ranks[d], widths[d]) for d in range(accepted)]
        outcomes += [(None, widths[accepted])] if accepted < tree.depth else []
        chain_drafts = accepted_in(chain, ranks)
        policy.observe(tree, accepted, {tree: accepted, chain: chain_drafts}, outcomes)
        tokens.append(1 + accepted)
    truth = sum(tokens) / len(tokens)
    for _ in range(100):  # then only the chain runs: the tree's replays fade
        policy.observe(chain, accepted_in(chain, ranked_world_round(rng, 0.4)))
    assert policy.modelled_tokens(tree) > 1.3 * truth  # the even spread promises far more
    assert policy.expected_tokens(tree) == pytest.approx(truth, rel=0.15)
