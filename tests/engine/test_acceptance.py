"""Non-trivial acceptance: with a head that knows its target, several drafts are accepted per
round, paths end early (partial acceptance, KV gathered from the middle of the tree) and the
output still equals vanilla greedy decoding."""

from __future__ import annotations

from collections import Counter

import pytest

from backend.config import TreeConfig
from tests.engine.helpers import make_runner, run
from tests.factories import easy_llama_pair


@pytest.mark.parametrize(
    "tree, partial",
    [
        (TreeConfig(), True),
        (TreeConfig(total_tokens=9, depth=8, top_k=1), True),
        (TreeConfig(shape="static"), False),  # depth 5: this pair often gets all of it right
    ],
    ids=["dynamic", "chain", "static"],
)
def test_tau_above_1_5_with_identical_output(tree: TreeConfig, partial: bool) -> None:
    target, head = easy_llama_pair()
    runner, drafter = make_runner(target, head)
    for prompt in ([1, 2, 3, 4], [9, 8, 7, 30, 31, 5]):
        eagle, rounds = run(runner, drafter, prompt, mode="eagle", max_new_tokens=120, tree=tree)
        vanilla, _ = run(runner, drafter, prompt, mode="vanilla", max_new_tokens=120)
        assert eagle.token_ids == vanilla.token_ids
        assert eagle.tau > 1.5
        assert eagle.rounds < vanilla.rounds / 1.5  # fewer target forwards
        lengths = Counter(eagle.acceptance_lengths)
        assert any(n > 2 for n in lengths), lengths  # several drafts accepted in a round
        if partial:  # paths end inside the tree
            assert any(1 < n <= tree.depth for n in lengths), lengths
        # per-round events add up to the summary
        assert sum(len(r.token_ids) for r in rounds) == eagle.new_tokens
        assert_acceptance_lengths_are_tokens_gained(eagle, rounds)


def assert_acceptance_lengths_are_tokens_gained(summary, rounds) -> None:
    """A round's acceptance length is the tokens it gained: its accepted drafts + the bonus
    token (fewer only in a last round cut short by a stop); tau is their mean."""
    verified = [r for r in rounds if r.round_index > 0]
    assert list(summary.acceptance_lengths) == [len(r.token_ids) for r in verified]
    for length, event in list(zip(summary.acceptance_lengths, verified))[:-1]:
        assert length == event.num_accepted_drafts + 1
    assert summary.tau == pytest.approx(sum(summary.acceptance_lengths) / summary.rounds)
    assert summary.tau == pytest.approx((summary.new_tokens - 1) / summary.rounds)
