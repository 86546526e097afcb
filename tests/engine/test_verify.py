"""Verification on hand-built logits: the argmax of each row spells what the target wants."""

from __future__ import annotations

import pytest
import torch

from backend.config import SamplingConfig
from backend.engine.sampling import make_generator
from backend.engine.tree import DraftTree
from backend.engine.verify import greedy_accept, sample_accept

V = 20


def logits_wanting(next_tokens: list[int]) -> torch.Tensor:
    """Row i has its argmax at next_tokens[i] (what the target predicts after node i)."""
    logits = torch.zeros(len(next_tokens), V)
    for row, token in enumerate(next_tokens):
        logits[row, token] = 5.0
    return logits


# root(0) -> 1 -> 2 -> 3 ; root -> 4 -> 5 ; 1 -> 6
PARENTS = [-1, 0, 1, 2, 0, 4, 1]
TOKENS = [9, 11, 12, 13, 14, 15, 16]


def tree_of(parents: list[int], tokens: list[int]) -> DraftTree:
    return DraftTree.from_parents(torch.tensor(tokens), torch.tensor(parents))


def test_perfect_chain_accepts_everything_plus_bonus() -> None:
    tree = tree_of(PARENTS, TOKENS)
    #            after: root 1   2   3  4  5  6
    acc = greedy_accept(tree, logits_wanting([11, 12, 13, 7, 0, 0, 0]))
    assert acc.accepted_nodes == (1, 2, 3)
    assert acc.token_ids == (11, 12, 13, 7)
    assert acc.bonus_token_id == 7


def test_early_mismatch_takes_the_other_branch() -> None:
    tree = tree_of(PARENTS, TOKENS)
    acc = greedy_accept(tree, logits_wanting([14, 12, 13, 7, 15, 3, 0]))
    assert acc.accepted_nodes == (4, 5)
    assert acc.token_ids == (14, 15, 3)


def test_nothing_accepted_gives_the_targets_own_token() -> None:
    tree = tree_of(PARENTS, TOKENS)
    acc = greedy_accept(tree, logits_wanting([2, 12, 13, 7, 15, 3, 0]))
    assert acc.accepted_nodes == ()
    assert acc.token_ids == (2,)


def test_partial_path_stops_at_first_wrong_node() -> None:
    tree = tree_of(PARENTS, TOKENS)
    # 1 is right, 2 is wrong (target wants 16 after node 1 -> sibling 6 is right instead)
    acc = greedy_accept(tree, logits_wanting([11, 16, 13, 7, 0, 0, 4]))
    assert acc.accepted_nodes == (1, 6)
    assert acc.token_ids == (11, 16, 4)


def test_root_only_tree_is_plain_decoding() -> None:
    tree = DraftTree.root_only(9)
    acc = greedy_accept(tree, logits_wanting([5]))
    assert acc.token_ids == (5,) and acc.accepted_nodes == ()


def test_tree_shape_helpers() -> None:
    tree = tree_of(PARENTS, TOKENS)
    assert tree.depths.tolist() == [0, 1, 2, 3, 1, 2, 2]
    assert tree.ancestors[3].nonzero().flatten().tolist() == [0, 1, 2, 3]
    assert tree.ancestors[6].nonzero().flatten().tolist() == [0, 1, 6]
    assert tree.children()[1] == [2, 6]


def test_sampling_with_certain_target_accepts_like_greedy() -> None:
    """A one-hot target distribution leaves no randomness: sampling = greedy."""
    tree = tree_of(PARENTS, TOKENS)
    logits = logits_wanting([11, 12, 13, 7, 0, 0, 0]) * 100
    acc = sample_accept(tree, logits, SamplingConfig(temperature=1.0), make_generator(0))
    assert acc.token_ids == (11, 12, 13, 7)


@pytest.mark.parametrize("top_p", [1.0, 0.7])
def test_sampling_rule_is_exact_for_one_node(top_p: float) -> None:
    """First emitted token of sample_accept is distributed as the processed target p, whatever
    the drafted children are (10k draws; total-variation distance well under 0.03)."""
    torch.manual_seed(0)
    logits = torch.randn(7, V)
    tree = tree_of(PARENTS, [9, int(logits[0].argmax()), 12, 13, 3, 15, 16])
    sampling = SamplingConfig(temperature=1.0, top_p=top_p)
    from backend.engine.sampling import processed_probs

    expected = processed_probs(logits[0], sampling)
    generator = make_generator(123)
    counts = torch.zeros(V)
    for _ in range(10_000):
        counts[sample_accept(tree, logits, sampling, generator).token_ids[0]] += 1
    tv = 0.5 * (counts / counts.sum() - expected).abs().sum()
    assert tv < 0.03, float(tv)


def test_drafted_trees_have_the_configured_shape() -> None:
    """Static trees follow EAGLE-1's widths 4/8/8/3/2 with every node one level below its
    parent; dynamic trees have exactly total_tokens nodes with parents before children."""
    from backend.config import TreeConfig
    from backend.engine.tree import EAGLE1_STATIC_PATHS
    from tests.engine.helpers import make_runner
    from tests.factories import tiny_head, tiny_target

    target = tiny_target("llama", num_layers=8)
    runner, drafter = make_runner(target, tiny_head("eagle1", target))
    prompt = torch.tensor([3, 4, 5, 6])
    cache = runner.new_cache()
    drafter.begin(prompt, 7, runner.prefill(prompt, cache, with_features=True).features)
    static = drafter.propose(7, TreeConfig(shape="static"))
    assert static.size == 1 + len(EAGLE1_STATIC_PATHS)
    assert torch.bincount(static.depths).tolist() == [1, 4, 8, 8, 3, 2]
    assert (static.depths[1:] == static.depths[static.parents[1:]] + 1).all()
    for config in (
        TreeConfig(total_tokens=16, depth=5, top_k=4),
        TreeConfig(total_tokens=9, depth=8, top_k=1),
    ):
        tree = drafter.propose(7, config)
        assert tree.size == config.total_tokens
        assert (tree.parents[1:] < torch.arange(1, tree.size)).all()
        assert (tree.depths[1:] == tree.depths[tree.parents[1:]] + 1).all()
        assert int(tree.depths.max()) <= config.depth


@pytest.mark.parametrize("top_p", [1.0, 0.7])
def test_sampled_drafts_rule_is_exact(top_p: float) -> None:
    """Children drawn i.i.d. from a draft q (recorded in the tree) and judged with
    min(1, p/q) and the residual norm(max(p - q, 0)): the first emitted token is distributed as
    p, and drafts are accepted far more often than p(top guess) would allow when q is close."""
    torch.manual_seed(1)
    logits = torch.randn(3, V)
    sampling = SamplingConfig(temperature=1.0, top_p=top_p)
    from backend.engine.sampling import processed_probs

    expected = processed_probs(logits[0], sampling)
    q = torch.softmax(logits[0] + 0.3 * torch.randn(V), dim=-1)  # a near miss of p
    generator = make_generator(7)
    counts, accepted = torch.zeros(V), 0
    for _ in range(10_000):
        drawn = torch.multinomial(q, 2, replacement=True, generator=generator)
        tree = DraftTree.from_parents(
            torch.tensor([9, int(drawn[0]), int(drawn[1])]),
            torch.tensor([-1, 0, 0]),
            proposal_probs=torch.stack([q, torch.zeros(V), torch.zeros(V)]),
            proposal_ids=torch.arange(V),
        )
        acceptance = sample_accept(tree, logits, sampling, generator)
        counts[acceptance.token_ids[0]] += 1
        accepted += acceptance.num_accepted_drafts
    tv = 0.5 * (counts / counts.sum() - expected).abs().sum()
    assert tv < 0.03, float(tv)
    assert accepted / 10_000 > float(expected.max()), accepted


def test_sampled_trees_are_chains_of_draws_with_their_distributions() -> None:
    from backend.config import TreeConfig
    from tests.engine.helpers import make_runner
    from tests.factories import tiny_head, tiny_target

    target = tiny_target("llama", num_layers=8)
    runner, drafter = make_runner(target, tiny_head("eagle3", target, draft_vocab_size=100))
    prompt = torch.tensor([3, 4, 5, 6])
    cache = runner.new_cache()
    drafter.begin(prompt, 7, runner.prefill(prompt, cache, with_features=True).features)
    sampling = SamplingConfig(temperature=1.0)
    tree = drafter.propose(
        7, TreeConfig(total_tokens=9, depth=4, top_k=2), sampling, make_generator(0)
    )
    assert tree.size == 9  # 2 branches x 4 levels + root
    assert tree.parents.tolist() == [-1, 0, 0, 1, 2, 3, 4, 5, 6]
    assert tree.depths.tolist() == [0, 1, 1, 2, 2, 3, 3, 4, 4]
    rows = tree.proposal_probs.sum(dim=-1)
    assert torch.allclose(rows[:7], torch.ones(7)) and (rows[7:] == 0).all()  # leaves: none
    for node in range(1, tree.size):  # every draft had positive probability under its q
        column = (tree.proposal_ids == tree.token_ids[node]).nonzero().flatten()
        assert float(tree.proposal_probs[tree.parents[node], column].sum()) > 0
    chain = drafter.propose(
        7, TreeConfig(total_tokens=5, depth=6, top_k=1), sampling, make_generator(1)
    )
    assert chain.is_chain and chain.size == 5  # total_tokens caps the depth
    rows = chain.proposal_probs.sum(dim=-1)
    assert torch.allclose(rows[:4], torch.ones(4)) and rows[4] == 0


def test_chain_fast_path_equals_the_top1_dynamic_tree() -> None:
    from backend.config import TreeConfig
    from tests.engine.helpers import make_runner
    from tests.factories import tiny_head, tiny_target

    target = tiny_target("qwen2", num_layers=8)
    runner, drafter = make_runner(target, tiny_head("eagle3", target, draft_vocab_size=100))
    prompt = torch.tensor([3, 4, 5, 6, 9, 1])
    cache = runner.new_cache()
    drafter.begin(prompt, 7, runner.prefill(prompt, cache, with_features=True).features)
    drafter.propose(7, TreeConfig(total_tokens=2, depth=1, top_k=1))  # flush the prompt
    for depth in (1, 3, 6):
        fast = drafter.propose(7, TreeConfig(total_tokens=depth + 1, depth=depth, top_k=1))
        drafter._flush()
        general = drafter._propose_dynamic(
            7, TreeConfig(total_tokens=depth + 1, depth=depth, top_k=1)
        )
        assert fast.token_ids.tolist() == general.token_ids.tolist()
        assert fast.parents.tolist() == general.parents.tolist()
        assert torch.equal(fast.ancestors, general.ancestors)
        assert fast.is_chain
