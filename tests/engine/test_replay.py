"""Replaying smaller shapes on a verified tree gives what verifying them would have given."""

from __future__ import annotations

import pytest
import torch

from backend.config import TreeConfig
from backend.engine.replay import covers, replay_accepted, replay_heads
from backend.engine.tree import DraftTree
from backend.engine.verify import greedy_accept
from tests.engine.helpers import make_runner
from tests.factories import easy_llama_pair, tiny_head, tiny_target

VERIFIED = TreeConfig(total_tokens=32, depth=6, top_k=4)
SAME_WIDTH = [TreeConfig(n, d, 4) for n, d in ((8, 3), (12, 4), (16, 5), (24, 6), (32, 6), (12, 6))]


def accepted_and_correct(runner, drafter, prompt: torch.Tensor, shape: TreeConfig):
    """Propose ``shape`` from the prompt, verify it, and return (tree, acceptance)."""
    cache = runner.new_cache()
    step = runner.prefill(prompt, cache, with_features=True)
    root = int(step.logits[-1].argmax())
    drafter.begin(prompt, root, step.features)
    tree = drafter.propose(root, shape)
    verified = runner.verify(tree, cache, with_features=False)
    return tree, greedy_accept(tree, verified.logits)


@pytest.mark.parametrize("pair", ["easy", "random"])
def test_replay_matches_verifying_each_shape_of_the_same_width(pair) -> None:
    if pair == "easy":
        target, head = easy_llama_pair()
    else:
        target = tiny_target()
        head = tiny_head("eagle3", target)
    runner, drafter = make_runner(target, head)
    generator = torch.Generator().manual_seed(3)
    checked = 0
    for _ in range(6):
        prompt = torch.randint(0, target.config.vocab_size, (12,), generator=generator)
        tree, acceptance = accepted_and_correct(runner, drafter, prompt, VERIFIED)
        replayed = replay_accepted(tree, acceptance.correct, SAME_WIDTH)
        for shape, guess in zip(SAME_WIDTH, replayed):
            _, real = accepted_and_correct(runner, drafter, prompt, shape)
            assert guess == real.num_accepted_drafts, (shape, guess, real)
            checked += guess
        assert replayed[SAME_WIDTH.index(VERIFIED)] == acceptance.num_accepted_drafts
    if pair == "easy":
        assert checked > 0  # drafts were accepted, so the replay was put to the test


def test_replay_on_a_hand_made_tree() -> None:
    # root -> a(rank 0) -> c(rank 0); root -> b(rank 1) -> d(rank 0); scores order a, b, c, d
    tree = DraftTree.from_parents(torch.tensor([0, 1, 2, 3, 4]), torch.tensor([-1, 0, 0, 1, 2]))
    tree = type(tree)(
        tree.token_ids,
        tree.parents,
        tree.depths,
        tree.ancestors,
        ranks=torch.tensor([0, 0, 1, 0, 0]),
        scores=torch.tensor([0.0, -0.1, -0.5, -0.6, -0.9]),
    )
    correct = torch.tensor([True, False, True, False, True])  # b then d are right
    shapes = [TreeConfig(2, 1, 1), TreeConfig(3, 1, 2), TreeConfig(4, 2, 2), TreeConfig(5, 2, 2)]
    assert replay_accepted(tree, correct, shapes) == [0, 1, 1, 2]
    chain = DraftTree.chain(torch.tensor([0, 1, 2, 3]))
    assert replay_accepted(chain, torch.tensor([True, True, True, False]), shapes) == [1, 1, 2, 2]


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
    shapes = [*SAME_WIDTH, chain, wider]
    replayed = replay_heads(VERIFIED, shapes, tree, acceptance.correct, 0)
    assert wider not in replayed and replayed[None] == 0
    greedy = dict(zip(shapes[:-1], replay_accepted(tree, acceptance.correct, shapes[:-1])))
    assert {s: replayed[s] for s in shapes[:-1]} == greedy
    # sampled chains: a chain's prefixes accept what it accepted, up to their depth
    sampled = replay_heads(TreeConfig(9, 8, 1), [chain, TreeConfig(8, 7, 1)], tree, None, 5)
    assert sampled == {None: 0, chain: 3, TreeConfig(8, 7, 1): 5}
    assert replay_heads(None, shapes, tree, acceptance.correct, 0) == {None: 0}
