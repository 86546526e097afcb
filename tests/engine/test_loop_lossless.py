"""Statistical losslessness of EAGLE sampling, end to end.

On a 16-token-vocabulary target we compute the EXACT distribution of the 2nd and 3rd generated
tokens (summing over all prefixes in one batched forward) and compare it with 2,000 EAGLE
samples by a chi-square statistic (bins with expected count < 5 merged). With 15 degrees of
freedom the 99.9% quantile is 37.7; the bound 45 leaves room, and the fixed seeds make the
test deterministic. A negative control (a sampler that always accepts drafts) must fail the
same bound, which shows the test can tell a biased sampler apart.
"""

from __future__ import annotations

import pytest
import torch

import backend.engine.loop as loop
from backend.config import SamplingConfig, TreeConfig
from backend.engine.calibration import CostModel
from backend.engine.sampling import processed_probs
from backend.engine.verify import greedy_accept
from tests.engine.helpers import make_runner, run
from tests.factories import tiny_head, tiny_target

VOCAB = 16
PROMPT = [3, 7, 1, 12]
SAMPLES = 2000
BOUND = 45.0


def exact_marginals(
    target, sampling: SamplingConfig, prompt_ids: list[int] = PROMPT
) -> tuple[torch.Tensor, torch.Tensor]:
    """P(2nd token) and P(3rd token) under the processed target distribution (on the CPU,
    wherever ``target`` runs)."""
    tokens = torch.arange(VOCAB, device=target.device)
    with torch.no_grad():
        prompt = torch.tensor([prompt_ids], device=target.device)
        p1 = processed_probs(target(prompt).logits[0, -1], sampling)  # [V]
        seq1 = torch.cat([prompt.expand(VOCAB, -1), tokens[:, None]], dim=1)
        p2_given = processed_probs(target(seq1).logits[:, -1], sampling)  # [V1, V2]
        joint12 = p1[:, None] * p2_given
        pairs = torch.cartesian_prod(tokens, tokens)  # [V*V, 2]
        seq2 = torch.cat([prompt.expand(VOCAB * VOCAB, -1), pairs], dim=1)
        p3_given = processed_probs(target(seq2).logits[:, -1], sampling).view(VOCAB, VOCAB, VOCAB)
        joint123 = joint12[:, :, None] * p3_given
    return joint12.sum(0).cpu(), joint123.sum((0, 1)).cpu()


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    small = expected < 5
    stat = ((counts[~small] - expected[~small]) ** 2 / expected[~small]).sum()
    if small.any() and expected[small].sum() > 0:
        stat += (counts[small].sum() - expected[small].sum()) ** 2 / expected[small].sum()
    return float(stat)


SAMPLED = TreeConfig(total_tokens=8, depth=3, top_k=3)  # at T > 0: 2 chains of draws from q
TOP_K = TreeConfig(shape="static", depth=3)  # deterministic top-k drafts at any temperature


def sample_counts(
    runner,
    drafter,
    sampling: SamplingConfig,
    tree: TreeConfig = SAMPLED,
    prompt: list[int] = PROMPT,
    costs: CostModel | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Counts of the 2nd and 3rd tokens over SAMPLES seeded runs (``costs`` for an auto tree)."""
    second, third = torch.zeros(VOCAB), torch.zeros(VOCAB)
    accepted = 0
    for i in range(SAMPLES):
        seeded = SamplingConfig(sampling.temperature, sampling.top_p, sampling.top_k, seed=i)
        summary, rounds = run(
            runner,
            drafter,
            prompt,
            mode="eagle",
            max_new_tokens=3,
            sampling=seeded,
            tree=tree,
            costs=costs,
        )
        second[summary.token_ids[1]] += 1
        third[summary.token_ids[2]] += 1
        accepted += sum(r.num_accepted_drafts for r in rounds)
    # The verification rule must really be exercised: drafts accepted in a good share of runs.
    assert accepted > SAMPLES * 0.3, accepted
    return second, third


def sharpened_pair(device: torch.device | str = "cpu"):
    """A tiny target sharpened a little so drafts are often accepted, with an EAGLE-1 head,
    both on ``device``."""
    target = tiny_target("llama", vocab_size=VOCAB, num_layers=8, seed=3).to(device)
    with torch.no_grad():
        target.lm_head.weight.mul_(8.0)
    head = tiny_head("eagle1", target, seed=4).to(device)
    return target, make_runner(target, head)


@pytest.fixture(scope="module")
def pair():
    return sharpened_pair()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sampling", "tree"),
    [
        (SamplingConfig(temperature=1.0), SAMPLED),
        (SamplingConfig(temperature=0.8, top_p=0.7), SAMPLED),
        (SamplingConfig(temperature=1.0), TOP_K),
    ],
)
def test_eagle_sampling_matches_the_target_distribution(pair, sampling, tree) -> None:
    target, (runner, drafter) = pair
    p2, p3 = exact_marginals(target, sampling)
    second, third = sample_counts(runner, drafter, sampling, tree)
    assert chi_square(second, p2) < BOUND
    assert chi_square(third, p3) < BOUND


@pytest.mark.slow
def test_a_biased_sampler_is_caught(pair, monkeypatch) -> None:
    """Negative control: accepting every draft the target's argmax agrees with (greedy path)
    while sampling only the bonus token is NOT lossless; the same test must reject it."""
    target, (runner, drafter) = pair
    sampling = SamplingConfig(temperature=1.0)

    def biased(tree, logits, sampling, generator):
        return greedy_accept(tree, logits)

    monkeypatch.setattr(loop, "sample_accept", biased)
    p2, p3 = exact_marginals(target, sampling)
    second, third = sample_counts(runner, drafter, sampling)
    assert max(chi_square(second, p2), chi_square(third, p3)) > BOUND


@pytest.mark.slow
def test_sampling_is_lossless_on_a_sliding_window_target() -> None:
    """A Gemma 3 style target (full layers mixed with 4-token windows) with a prompt of 3
    windows: the windowed tree masks keep sampled EAGLE exactly on the target's distribution."""
    from transformers import AutoModelForCausalLM, Gemma3TextConfig

    torch.manual_seed(5)
    config = Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_hidden_layers=8,
        sliding_window=4,
        query_pre_attn_scalar=16,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    config._attn_implementation = "sdpa"
    target = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(8.0)
    runner, drafter = make_runner(target, tiny_head("eagle1", target, seed=6))
    assert runner.layout.per_type_masks
    prompt = [3, 7, 1, 12, 9, 9, 4, 0, 15, 2, 8, 5]
    sampling = SamplingConfig(temperature=1.0)
    p2, p3 = exact_marginals(target, sampling, prompt)
    # static top-k trees: branching, so every layer type's windowed tree mask is used
    second, third = sample_counts(runner, drafter, sampling, TOP_K, prompt)
    assert chi_square(second, p2) < BOUND
    assert chi_square(third, p3) < BOUND
