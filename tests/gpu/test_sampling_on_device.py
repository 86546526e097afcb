"""The sampled path on the device: 2,000 seeded EAGLE generations match the target's exact
distribution of the 2nd and 3rd tokens (the CPU test's chi-square check and bound, see
tests/engine/test_loop_lossless.py), with draws on the CPU generator and logits on the device."""

from __future__ import annotations

from backend.config import SamplingConfig
from tests.engine.test_loop_lossless import (
    BOUND,
    chi_square,
    exact_marginals,
    sample_counts,
    sharpened_pair,
)
from tests.gpu.device import DEVICE, ON_DEVICE

pytestmark = ON_DEVICE


def test_sampled_eagle_matches_the_target_distribution() -> None:
    target, (runner, drafter) = sharpened_pair(DEVICE)
    assert runner.device == DEVICE and drafter.device == DEVICE
    sampling = SamplingConfig(temperature=1.0)
    p2, p3 = exact_marginals(target, sampling)
    second, third = sample_counts(runner, drafter, sampling)
    assert chi_square(second, p2) < BOUND
    assert chi_square(third, p3) < BOUND
