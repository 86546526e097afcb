"""Statistical losslessness of the default temperature > 0 path: sampled chains chosen by the
automatic tree policy (``TreeConfig(auto=True)``, the GenerationConfig default), verified by
``sample_accept`` with its real residual.

Same method and bound as ``test_loop_lossless.py``: the exact marginals of the 2nd and 3rd
generated tokens against 2,000 seeded EAGLE samples by chi-square (bins with expected count < 5
merged, at most 15 degrees of freedom, 99.9% quantile 37.7, bound 45). The negative control is
the classic slip in speculative sampling: accept with min(1, p/q) as it should, but after a
rejection take p with the draft zeroed instead of norm(max(p - q, 0)). It must fail the bound.
"""

from __future__ import annotations

import pytest
import torch

import backend.engine.verify as verify
from backend.config import SamplingConfig, TreeConfig
from backend.engine.autotune import TreePolicy
from backend.engine.calibration import CostModel
from tests.engine.helpers import run
from tests.engine.test_loop_lossless import (
    BOUND,
    PROMPT,
    chi_square,
    exact_marginals,
    sample_counts,
    sharpened_pair,
)

AUTO = TreeConfig(auto=True)
# Flat verification and cheap head steps: the policy's best shape is a sampled chain several
# drafts deep (a fixed cost model keeps its choice, and so the test, deterministic).
COSTS = CostModel(verify_s={1: 1.0, 60: 1.0}, draft_step_s=0.05, chain_step_s=0.05)


@pytest.fixture(scope="module")
def pair():
    return sharpened_pair()


def auto_counts(runner, drafter, sampling: SamplingConfig) -> tuple[torch.Tensor, torch.Tensor]:
    return sample_counts(runner, drafter, sampling, AUTO, costs=COSTS)


def test_the_auto_policy_drafts_sampled_chains_at_temperature(pair) -> None:
    """What the statistical tests below exercise is what auto does at T > 0: chains of draws."""
    _, (runner, drafter) = pair
    choice = TreePolicy.for_decoding(COSTS, sampled=True, has_head=True).choose().head
    assert choice is not None and choice.top_k == 1 and choice.depth >= 2
    sampling = SamplingConfig(temperature=1.0, seed=0)
    _, rounds = run(
        runner,
        drafter,
        PROMPT,
        mode="eagle",
        max_new_tokens=12,
        sampling=sampling,
        tree=AUTO,
        costs=COSTS,
        stop_on_eos=False,
    )
    drafted = [r for r in rounds[1:] if r.tree_size > 1]
    assert drafted, "the policy never drafted"
    # a chain of d draws has d + 1 nodes, and the first round uses the policy's first choice
    assert rounds[1].tree_size == choice.depth + 1


@pytest.mark.slow
@pytest.mark.parametrize(
    "sampling",
    [
        SamplingConfig(temperature=1.0),
        SamplingConfig(temperature=0.7, top_k=5),
        SamplingConfig(temperature=0.7, top_p=0.8),
    ],
    ids=["t1", "t0.7-top_k5", "t0.7-top_p0.8"],
)
def test_sampled_chains_match_the_target_distribution(pair, sampling) -> None:
    target, (runner, drafter) = pair
    p2, p3 = exact_marginals(target, sampling)
    second, third = auto_counts(runner, drafter, sampling)
    assert chi_square(second, p2) < BOUND
    assert chi_square(third, p3) < BOUND


@pytest.mark.slow
def test_a_residual_that_only_zeroes_the_draft_is_caught(pair, monkeypatch) -> None:
    """Negative control: the acceptance test is right, the residual is wrong (p with the
    rejected draft zeroed, renormalised by sample_accept, instead of max(p - q, 0)). Tokens
    the head over-proposes are then over-produced: the same statistic must reject it."""
    target, (runner, drafter) = pair
    sampling = SamplingConfig(temperature=1.0)

    def zero_the_draft(p: torch.Tensor, q: torch.Tensor | None, token: int) -> torch.Tensor:
        p[token] = 0.0
        return p

    monkeypatch.setattr(verify, "rejection_residual", zero_the_draft)
    p2, p3 = exact_marginals(target, sampling)
    second, third = auto_counts(runner, drafter, sampling)
    assert max(chi_square(second, p2), chi_square(third, p3)) > BOUND
