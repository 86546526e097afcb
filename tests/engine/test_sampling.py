"""The draw primitive every sampled token goes through (vanilla steps, drafts, bonus tokens)."""

from __future__ import annotations

import torch

from backend.engine.sampling import draw, make_generator


def test_draws_follow_the_distribution_and_never_pick_impossible_tokens() -> None:
    probs = torch.softmax(torch.randn(64, generator=torch.Generator().manual_seed(0)), dim=-1)
    probs[[0, 7, 63]] = 0.0  # the first, a middle and the last entry are impossible
    counts = torch.bincount(draw(probs, make_generator(1), 50_000), minlength=64).float()
    assert counts[[0, 7, 63]].sum() == 0
    expected = probs / probs.sum() * 50_000
    seen = expected > 0
    chi2 = float(((counts[seen] - expected[seen]) ** 2 / expected[seen]).sum())
    assert chi2 < 110, chi2  # 60 degrees of freedom: the 99.9% quantile is 99.6


def test_rows_are_drawn_independently_and_reproducibly() -> None:
    probs = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 2.0]])  # unnormalised rows are fine
    assert draw(probs, make_generator(0), 4).tolist() == [[1, 1, 1, 1], [2, 2, 2, 2]]
    mixed = torch.tensor([0.25, 0.25, 0.5])
    assert torch.equal(draw(mixed, make_generator(3), 20), draw(mixed, make_generator(3), 20))
