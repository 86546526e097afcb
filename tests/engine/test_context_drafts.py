"""Context drafts: the n-gram index over the text, and their chains merged into the head's tree."""

from __future__ import annotations

import torch

from backend.engine.context_drafts import ContextIndex, matched_length
from backend.engine.tree import CONTEXT, HEAD, DraftTree


def test_the_most_recent_occurrence_of_the_suffix_is_continued_first() -> None:
    text = [1, 2, 3, 4, 9, 1, 2, 3, 5, 8, 1, 2, 3]
    found = ContextIndex(text).continuations(length=2, count=2)
    assert found == [(5, 8), (4, 9)]


def test_a_longer_suffix_match_comes_before_a_shorter_one() -> None:
    # "7 2 3" occurred once (then 6); "2 3" more recently (then 4)
    text = [7, 2, 3, 6, 0, 2, 3, 4, 0, 7, 2, 3]
    assert ContextIndex(text).continuations(length=1, count=2) == [(6,), (4,)]


def test_identical_continuations_count_once_and_no_match_gives_none() -> None:
    index = ContextIndex([1, 2, 5, 1, 2, 5, 1, 2])
    assert index.continuations(length=1, count=3) == [(5,)]
    assert ContextIndex([1, 2, 3, 4]).continuations(length=3, count=2) == []
    assert ContextIndex([1]).continuations(length=3, count=2) == []


def test_a_loop_is_continued_past_the_end_of_the_text() -> None:
    text = [8, 1, 2, 3, 1, 2, 3, 1, 2]  # a loop of period 3, cut inside its period
    (first,) = ContextIndex(text).continuations(length=7, count=1)
    assert first == (3, 1, 2, 3, 1, 2, 3)


def test_extending_the_index_equals_building_it_at_once() -> None:
    text = [int(t) for t in torch.randint(0, 6, (200,), generator=torch.Generator().manual_seed(0))]
    grown = ContextIndex(text[:50])
    for start in range(50, 200, 7):
        grown.extend(text[start : start + 7])
    whole = ContextIndex(text)
    assert grown.tokens == whole.tokens
    assert grown.continuations(6, 3) == whole.continuations(6, 3)


def test_matched_length_waits_until_the_text_decides() -> None:
    assert matched_length((4, 5, 6), [1, 4, 5, 7], start=1) == 2  # a mismatch decides
    assert matched_length((4, 5), [1, 4, 5, 7], start=1) == 2  # the whole candidate matched
    assert matched_length((4, 5, 6), [1, 4, 5], start=1) is None  # 6 not written yet


def head_tree() -> DraftTree:
    # root 9; children 1 and 2; 1 -> 3 -> 4
    return DraftTree.from_parents(torch.tensor([9, 1, 2, 3, 4]), torch.tensor([-1, 0, 0, 1, 3]))


def test_a_chain_follows_the_nodes_it_repeats_and_hangs_from_the_deepest() -> None:
    tree = head_tree().with_chains([(1, 3, 7, 8)])
    assert tree.token_ids.tolist() == [9, 1, 2, 3, 4, 7, 8]
    assert tree.parents.tolist() == [-1, 0, 0, 1, 3, 3, 5]  # 7 continues the path 1 -> 3
    assert tree.depths.tolist() == [0, 1, 1, 2, 3, 3, 4]
    assert tree.sources == (0, HEAD | CONTEXT, HEAD, HEAD | CONTEXT, HEAD, CONTEXT, CONTEXT)
    # ancestors follow the merged parents
    assert tree.ancestors[6].nonzero().flatten().tolist() == [0, 1, 3, 5, 6]


def test_duplicate_chains_merge_and_new_branches_start_at_the_root() -> None:
    tree = head_tree().with_chains([(5, 6), (5, 6, 1), (2,)])
    assert tree.token_ids.tolist() == [9, 1, 2, 3, 4, 5, 6, 1]
    assert tree.parents.tolist() == [-1, 0, 0, 1, 3, 0, 5, 6]
    assert [tree.source_of(n) for n in range(tree.size)] == [0, 1, 3, 1, 1, 2, 2, 2]
    assert not tree.is_chain


def test_a_chain_alone_on_a_root_is_a_chain() -> None:
    tree = DraftTree.root_only(9).with_chains([(4, 5, 6)])
    assert tree.is_chain and tree.size == 4
    assert tree.sources == (0, CONTEXT, CONTEXT, CONTEXT)
