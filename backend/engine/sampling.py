"""Token choice shared by vanilla decoding and lossless verification: both read the SAME
processed target distribution, which is what makes EAGLE sampling lossless against vanilla.
"""

from __future__ import annotations

import torch

from backend.config import SamplingConfig


def processed_probs(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """Target distribution after temperature, top-k and top-p: [..., V] float32, rows sum to 1."""
    scores = logits.float() / sampling.temperature
    if sampling.top_k and sampling.top_k < scores.shape[-1]:
        kth = scores.topk(sampling.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if sampling.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(mass_before >= sampling.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def make_generator(seed: int | None) -> torch.Generator:
    """CPU generator: sampling draws happen on CPU so a seed reproduces on every device."""
    generator = torch.Generator(device="cpu")
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def draw(probs: torch.Tensor, generator: torch.Generator, count: int = 1) -> torch.Tensor:
    """``count`` i.i.d. draws from each row of ``probs`` [..., V] (rows need not be normalised):
    [..., count] long, on the CPU. Inverse-CDF sampling: one uniform per draw and a binary
    search, an order of magnitude cheaper than torch.multinomial on small CPU rows; a
    zero-probability entry is never drawn (``right=True`` skips flat CDF steps)."""
    cdf = probs.detach().float().cpu().cumsum(dim=-1)
    total = cdf[..., -1:]
    uniforms = torch.rand((*cdf.shape[:-1], count), generator=generator) * total
    return torch.searchsorted(cdf, uniforms, right=True).clamp_(max=cdf.shape[-1] - 1)


def sample_from(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One draw from a 1-D distribution."""
    return int(draw(probs, generator)[0])


def uniform(generator: torch.Generator) -> float:
    return float(torch.rand((), generator=generator).item())


def next_token(logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator) -> int:
    """The target's own choice from one row of logits [V] (vanilla step, bonus token)."""
    if sampling.greedy:
        return int(logits.argmax().item())
    return sample_from(processed_probs(logits, sampling), generator)
