"""Tree auto-tuning as pure logic on hand-made cost models (no timing in tests)."""

from __future__ import annotations

import random

from backend.config import TreeConfig
from backend.engine.autotune import FIRST_PROBE_AFTER, LADDER, MEASURED_SIZES, CostModel, TreePolicy
from tests.engine.helpers import make_runner, run
from tests.factories import easy_llama_pair, tiny_head, tiny_target

GPU_LIKE = CostModel({n: 0.010 + 0.00002 * n for n in MEASURED_SIZES}, draft_step_s=0.0008)
CPU_LIKE = CostModel({n: 0.005 * (1 + 0.25 * (n - 1)) for n in MEASURED_SIZES}, draft_step_s=0.0005)


def trained(policy: TreePolicy, accept_rate: float, rounds: int = 40) -> TreePolicy:
    """Feed rounds in which each depth is accepted with probability ``accept_rate``."""
    rng = random.Random(0)
    for _ in range(rounds):
        tree = policy.choose() or LADDER[0]
        accepted = 0
        while accepted < tree.depth and rng.random() < accept_rate:
            accepted += 1
        policy.observe(tree, accepted)
    return policy


def test_flat_gpu_costs_and_good_drafts_pick_a_large_tree() -> None:
    tree = trained(TreePolicy(GPU_LIKE), 0.9).choose()
    assert tree is not None and tree.total_tokens >= 24


def test_steep_cpu_costs_pick_a_small_tree() -> None:
    tree = trained(TreePolicy(CPU_LIKE), 0.9).choose()
    assert tree is not None and tree.total_tokens <= 12


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


def test_auto_tree_with_useless_head_is_mostly_plain_and_exact() -> None:
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
    cheap = trained(TreePolicy(costs), 0.85).choose()
    assert cheap is not None and cheap.top_k == 1
    dear = CostModel(CPU_LIKE.verify_s, draft_step_s=0.0015, chain_step_s=0.0015)
    costly = trained(TreePolicy(dear), 0.85).choose()
    assert costly is None or costly.depth <= cheap.depth  # dearer steps never draft deeper


def test_sampled_policy_only_considers_chains() -> None:
    """Even with flat GPU-like costs, where top-k trees grow to 32-60 nodes, a policy for
    sampled drafts picks a chain, as deep as the acceptance pays for."""
    from backend.engine.autotune import SAMPLED_LADDER

    assert all(t.top_k == 1 and t.total_tokens == t.depth + 1 for t in SAMPLED_LADDER)
    deep = trained(TreePolicy(GPU_LIKE, ladder=SAMPLED_LADDER), 0.95).choose()
    shallow = trained(TreePolicy(CPU_LIKE, ladder=SAMPLED_LADDER), 0.6).choose()
    assert deep is not None and deep in SAMPLED_LADDER and deep.depth >= 6
    assert shallow is None or shallow.depth < deep.depth


def test_a_new_request_probes_at_once_after_a_back_off() -> None:
    policy = trained(TreePolicy(CPU_LIKE), 0.0, rounds=12)
    while (tree := policy.choose()) is not None:  # let a pending probe fail
        policy.observe(tree, 0)
    assert policy.choose() is None  # backed off within the old reply
    policy.begin_request()
    assert policy.choose() == LADDER[0]  # the new prompt gets a probe on its first round
    policy.observe(LADDER[0], 0)
    assert policy.choose() is None  # a failed probe keeps the back-off
