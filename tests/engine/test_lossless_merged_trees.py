"""Statistical losslessness of sampling on merged trees: the head's sampled chain and chains copied
from the context, verified in one tree, where every child is tried with the distribution it was
drawn from (a context child is a point mass).

Same method and bound as ``test_loop_lossless.py``: the exact marginals of the 2nd and 3rd
generated tokens against 2,000 seeded samples by chi-square (bins with expected count < 5
merged, at most 15 degrees of freedom, 99.9% quantile 37.7, bound 45). The prompt holds the
pair (last prompt token, r) for every first token r, each followed by the target's likely next
tokens, so every reply's first round carries context drafts and they are often accepted. The
negative control tries a context child as if the head had drawn it (with the head's q): it must
fail the bound.
"""

from __future__ import annotations

import pytest
import torch

import backend.engine.verify as verify
from backend.config import SamplingConfig, TreeConfig
from backend.engine.autotune import Arm
from backend.engine.tree import HEAD
from tests.engine.helpers import run_arms
from tests.engine.test_loop_lossless import (
    BOUND,
    SAMPLES,
    VOCAB,
    chi_square,
    exact_marginals,
    sharpened_pair,
)

LAST = 3  # the prompt's last token: the suffix (LAST, first token) occurs earlier for every one
ARMS = (
    Arm(TreeConfig(total_tokens=3, depth=2, top_k=1), context=3, chains=1),
    Arm(None, context=3, chains=2),
    Arm(TreeConfig(total_tokens=4, depth=3, top_k=1), context=2, chains=2),
)


def repeating_prompt(target) -> list[int]:
    """Blocks (LAST, r, a_r, b_r) for every token r, then LAST: a_r, b_r are the target's argmax
    continuations of the prompt plus r (found again once the blocks hold them)."""
    follow = {r: [0, 0] for r in range(VOCAB)}
    for _ in range(2):
        prompt = [t for r in range(VOCAB) for t in (LAST, r, *follow[r])] + [LAST]
        with torch.no_grad():
            for r in range(VOCAB):
                first = target(torch.tensor([prompt + [r]])).logits[0, -1].argmax()
                second = target(torch.tensor([prompt + [r, int(first)]])).logits[0, -1].argmax()
                follow[r] = [int(first), int(second)]
    return [t for r in range(VOCAB) for t in (LAST, r, *follow[r])] + [LAST]


@pytest.fixture(scope="module")
def pair():
    target, (runner, drafter) = sharpened_pair()
    return target, runner, drafter, repeating_prompt(target)


def merged_counts(runner, drafter, prompt, sampling: SamplingConfig):
    second, third = torch.zeros(VOCAB), torch.zeros(VOCAB)
    context_accepted = head_accepted = 0
    for i in range(SAMPLES):
        seeded = SamplingConfig(sampling.temperature, sampling.top_p, sampling.top_k, seed=i)
        arms = ARMS[i % len(ARMS) :] + ARMS[: i % len(ARMS)]  # each arm opens a third of runs
        summary, _ = run_arms(
            runner, drafter, prompt, arms, mode="eagle", max_new_tokens=3, sampling=seeded
        )
        second[summary.token_ids[1]] += 1
        third[summary.token_ids[2]] += 1
        context_accepted += summary.accepted_context
        head_accepted += summary.accepted_head
    # both sources must really be exercised
    assert context_accepted > SAMPLES * 0.1, context_accepted
    assert head_accepted > SAMPLES * 0.05, head_accepted
    return second, third


@pytest.mark.slow
@pytest.mark.parametrize(
    "sampling",
    [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_p=0.8)],
    ids=["t1", "t0.7-top_p0.8"],
)
def test_merged_trees_match_the_target_distribution(pair, sampling) -> None:
    target, runner, drafter, prompt = pair
    p2, p3 = exact_marginals(target, sampling, prompt)
    second, third = merged_counts(runner, drafter, prompt, sampling)
    assert chi_square(second, p2) < BOUND
    assert chi_square(third, p3) < BOUND


@pytest.mark.slow
def test_a_context_draft_judged_as_the_heads_is_caught(pair, monkeypatch) -> None:
    """Negative control: a context child tried with the head's q at its parent (min(1, p/q)
    instead of p, residual max(p - q, 0)) over-produces the copied tokens."""
    target, runner, drafter, prompt = pair
    sampling = SamplingConfig(temperature=1.0)
    exact = verify.child_proposals

    def as_the_heads(tree, child, head_q):
        if head_q is not None and not tree.source_of(child) & HEAD:
            return [head_q]
        return exact(tree, child, head_q)

    monkeypatch.setattr(verify, "child_proposals", as_the_heads)
    p2, p3 = exact_marginals(target, sampling, prompt)
    second, third = merged_counts(runner, drafter, prompt, sampling)
    assert max(chi_square(second, p2), chi_square(third, p3)) > BOUND
