"""Replaying smaller shapes on a verified round gives what verifying them would have given."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from backend.config import TreeConfig
from backend.engine.autotune import Arm
from backend.engine.replay import Drafted, covers, drafted, replay_heads
from backend.engine.tree import Candidates, DraftTree
from backend.engine.verify import greedy_accept
from tests.engine.helpers import CyclingPolicy, make_runner, path_tokens, run, run_arms
from tests.factories import easy_llama_pair, tiny_head, tiny_target

VERIFIED = TreeConfig(total_tokens=32, depth=6, top_k=4)
# every shape VERIFIED covers: the same width, narrower ones, and chains
COVERED = [
    *(TreeConfig(n, d, 4) for n, d in ((8, 3), (12, 4), (16, 5), (24, 6), (32, 6), (12, 6))),
    *(TreeConfig(n, d, k) for n, d, k in ((8, 4, 2), (12, 5, 3), (16, 6, 2), (4, 3, 1), (7, 6, 1))),
]


def accepted_and_correct(runner, drafter, prompt: torch.Tensor, shape: TreeConfig):
    """Propose ``shape`` from the prompt, verify it, and return (tree, acceptance)."""
    cache = runner.new_cache()
    step = runner.prefill(prompt, cache, with_features=True)
    root = int(step.logits[-1].argmax())
    drafter.begin(prompt, root, step.features)
    tree = drafter.propose(root, shape)
    verified = runner.verify(tree, cache, with_features=False)
    return tree, greedy_accept(tree, verified.logits)


def paths_of(tree: DraftTree) -> frozenset[tuple[int, ...]]:
    """Every node's token path after the root."""
    return frozenset(tuple(path_tokens(tree, node)[1:]) for node in range(1, tree.size))


@pytest.mark.parametrize("pair", ["easy", "random"])
def test_replay_rebuilds_each_covered_shape_and_the_reply_decides_what_it_accepts(pair) -> None:
    if pair == "easy":
        target, head = easy_llama_pair()
    else:
        target = tiny_target()
        head = tiny_head("eagle3", target)
    runner, drafter = make_runner(target, head)
    generator = torch.Generator().manual_seed(3)
    rebuilt, checked = 0, 0
    for _ in range(6):
        prompt = torch.randint(0, target.config.vocab_size, (12,), generator=generator)
        reply, _ = run(runner, None, prompt.tolist(), mode="vanilla", max_new_tokens=10)
        text = [*prompt.tolist(), *reply.token_ids]  # the root is the reply's first token
        start = len(prompt) + 1
        tree, acceptance = accepted_and_correct(runner, drafter, prompt, VERIFIED)
        replayed = replay_heads(VERIFIED, COVERED, tree, acceptance.num_accepted_drafts, True)
        assert replayed[VERIFIED].paths == paths_of(tree)
        for shape in COVERED:
            real_tree, real = accepted_and_correct(runner, drafter, prompt, shape)
            drafts = replayed[shape]
            if drafts is None:  # a node this shape expands was ranked out of VERIFIED's levels
                continue
            rebuilt += 1
            assert drafts.paths == paths_of(real_tree), shape
            assert drafts.accepted(text, start, final=False) == real.num_accepted_drafts, shape
            checked += real.num_accepted_drafts
    assert rebuilt >= 0.9 * 6 * len(COVERED)
    if pair == "easy":
        assert checked > 0  # drafts were accepted, so the replay was put to the test


def test_drafts_wait_for_the_reply_to_decide_them() -> None:
    drafts = Drafted(frozenset({(5,), (6,), (5, 7), (5, 7, 9)}), depth=3)
    assert drafts.accepted([1, 5, 7], 1, final=False) is None  # 9 may still follow
    assert drafts.accepted([1, 5, 7], 1, final=True) == 2
    assert drafts.accepted([1, 5, 7, 8], 1, final=False) == 2
    assert drafts.accepted([1, 5, 7, 9, 4], 1, final=False) == 3
    assert drafts.accepted([1, 6, 3], 1, final=False) == 1
    assert drafts.accepted([1, 4], 1, final=False) == 0


def test_a_shape_wider_than_a_level_expanded_is_not_rebuilt() -> None:
    # candidates of width 2: the root's a, b; then only a expanded (a width-1 level), into c, d
    tree = DraftTree.chain(torch.tensor([0, 1, 3]))
    pool = Candidates(
        width=2,
        token_ids=torch.tensor([1, 2, 3, 4]),
        parents=torch.tensor([-1, -1, 0, 0]),
        scores=torch.tensor([-0.1, -0.5, -0.6, -2.0]),
    )
    tree = dataclasses.replace(tree, candidates=pool)
    assert drafted(tree, TreeConfig(3, 2, 1)).paths == {(1,), (1, 3)}
    assert drafted(tree, TreeConfig(3, 1, 2)).paths == {(1,), (2,)}
    assert drafted(tree, TreeConfig(4, 2, 2)) is None  # b would have been expanded too


def test_covers() -> None:
    assert covers(TreeConfig(16, 5, 4), TreeConfig(8, 4, 2))
    assert not covers(TreeConfig(16, 5, 4), TreeConfig(16, 5, 10))
    assert not covers(TreeConfig(16, 5, 4), TreeConfig(7, 6, 1))


def test_a_round_replays_the_head_shapes_it_covers_and_no_others() -> None:
    target, head = easy_llama_pair()
    runner, drafter = make_runner(target, head)
    tree, acceptance = accepted_and_correct(runner, drafter, torch.tensor([1, 2, 3, 4]), VERIFIED)
    wider = TreeConfig(total_tokens=60, depth=7, top_k=10)
    chain = TreeConfig(total_tokens=4, depth=3, top_k=1)
    shapes = [*COVERED, wider]
    replayed = replay_heads(VERIFIED, shapes, tree, 0, True)
    assert wider not in replayed and replayed[None] == 0
    assert {s: replayed[s] for s in COVERED} == {s: drafted(tree, s) for s in COVERED}
    # sampled chains: a chain's prefixes accept what it accepted, up to their depth
    sampled = replay_heads(TreeConfig(9, 8, 1), [chain, TreeConfig(8, 7, 1)], tree, 5, False)
    assert sampled == {None: 0, chain: 3, TreeConfig(8, 7, 1): 5}
    # a greedy chain's prefixes are decided by the verdicts at once
    chain_tree = DraftTree.chain(torch.tensor([0, 1, 2, 3, 4]))
    greedy = replay_heads(TreeConfig(5, 4, 1), [chain, TreeConfig(5, 4, 1)], chain_tree, 2, True)
    assert greedy == {None: 0, chain: 2, TreeConfig(5, 4, 1): 2}
    assert replay_heads(None, shapes, tree, 0, True) == {None: 0}


class RecordingPolicy(CyclingPolicy):
    """Cycles its arms and keeps what each round taught (decided in place as the reply grows)."""

    def __init__(self, arms: list[Arm]) -> None:
        super().__init__(arms)
        self.taught: list[tuple[Arm, dict]] = []

    def observe(self, arm: Arm, replayed: dict, *rest) -> None:
        self.taught.append((arm, replayed))
        super().observe(arm, replayed, *rest)


@pytest.mark.parametrize("with_context", [False, True])
def test_each_round_teaches_the_tuner_what_it_accepted(with_context) -> None:
    """End to end: the replay of the shape a round ran, decided by the reply, is the number
    of head drafts that round accepted, with or without a context index beside the head."""
    target, head = easy_llama_pair()
    runner, drafter = make_runner(target, head)
    shapes = [TreeConfig(16, 5, 4), TreeConfig(5, 4, 1), TreeConfig(8, 4, 2), TreeConfig(12, 5, 3)]
    arms = [Arm(s) for s in shapes] + ([Arm(None, 12, 1)] if with_context else [])
    policy = RecordingPolicy(arms)
    _, rounds = run_arms(
        runner, drafter, [1, 2, 3, 4], arms, policy, mode="eagle", max_new_tokens=80
    )
    played = [(arm, replayed, r) for (arm, replayed), r in zip(policy.taught, rounds[1:])]
    head_rounds = [(a, replayed, r) for a, replayed, r in played[:-1] if a.head and not a.context]
    assert len(head_rounds) >= 8
    for arm, replayed, completed in head_rounds:
        assert replayed[arm.head] == completed.num_accepted_drafts, arm
        assert all(isinstance(v, int) or v is None for v in replayed.values())
    assert sum(r.num_accepted_drafts for _, _, r in head_rounds) > len(head_rounds)
