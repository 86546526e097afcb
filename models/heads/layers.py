"""Blocks shared by the EAGLE-1/2 and EAGLE-3 heads: RMSNorm, rotary embedding (with linear and
llama3 scaling), attention over a transformers cache with a float additive mask, gated MLP.

Written for tree drafting: the attention takes explicit ``position_ids`` and a 4D additive
mask, so one call can run several tree nodes that see different ancestors. A draft step runs
one token at a time, where every op's fixed cost outweighs its arithmetic: q/k/v and gate/up
run as one product each once fused (``StackedLinears``), and q and k are rotated together.

The arithmetic lives in plain functions (``normalize``, ``rotary_angles``, ``attend``,
``gated_mlp``) over tensors gathered from the modules: training calls them through the head's
``forward`` with freshly gathered (differentiable) parameters, and drafting gathers the fused
inference tensors once (``DraftHead.draft_step``), because a one-token step's module calls,
attribute lookups and wrappers cost more than its arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.heads.config import HeadConfig
from models.stacked_linears import StackedLinears


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return normalize(x, self.weight, self.eps)


def normalize(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in float32 whatever the dtype; one fused op (drafting runs several per step)."""
    if x.dtype == weight.dtype == torch.float32:  # the same product, weight inside
        return F.rms_norm(x, weight.shape, weight, eps)
    normed = F.rms_norm(x.float(), weight.shape, eps=eps)
    return weight * normed.to(x.dtype)


def rope_inverse_frequencies(config: HeadConfig) -> torch.Tensor:
    """Per-pair rotation frequencies, with llama3 or linear scaling applied to frequencies."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = config.rope_scaling or {}
    rope_type = scaling.get("rope_type", "default")
    if rope_type == "linear":
        inv_freq = inv_freq / float(scaling["factor"])
    elif rope_type == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        inv_freq = torch.where(is_medium, smoothed, scaled)
    return inv_freq.float()


class Rotary(nn.Module):
    """Rotary angles from float32 frequencies whatever the head's dtype: a bfloat16 inv_freq
    would be off by up to a few tenths of a percent, drifting by radians at long range."""

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self._config = config
        self.register_buffer("inv_freq", rope_inverse_frequencies(config), persistent=False)

    def _apply(self, fn, recurse: bool = True):  # every .to() / .half() / .cuda() lands here
        super()._apply(fn, recurse)
        # Recomputed, not cast back: a round trip through bfloat16 has already lost the digits.
        self.inv_freq = rope_inverse_frequencies(self._config).to(self.inv_freq.device)
        return self

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rotary_angles(position_ids, self.inv_freq)


def rotary_angles(
    position_ids: torch.Tensor, inv_freq: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """position_ids [B, Q] -> cos, sin [B, 1, Q, head_dim]."""
    angles = position_ids[..., None].float() * inv_freq  # [B, Q, head_dim/2]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos()[:, None], angles.sin()[:, None]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos.to(x.dtype) + _rotate_half(x) * sin.to(x.dtype)


class Attention(nn.Module):
    """Llama attention's parameters; its arithmetic is ``attend`` (KV in layer 0 of the cache it
    is given)."""

    def __init__(self, config: HeadConfig, input_size: int) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        bias = config.qkv_bias
        self.q_proj = nn.Linear(input_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(input_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(input_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)
        self.qkv = StackedLinears(self.q_proj, self.k_proj, self.v_proj)
        # None: attention in the weights' dtype; float32 for a bfloat16 head on a CPU, whose
        # one-query bfloat16 attention slows down with the context far faster than float32's
        self.attention_dtype: torch.dtype | None = None

    def parts(self) -> AttentionParts:
        """The tensors ``attend`` needs: the fused q/k/v matrix at inference once fused, else
        (training) the three weights stacked anew, so gradients reach each."""
        qkv, qkv_bias = self.qkv.product_weights()
        return AttentionParts(
            qkv=qkv,
            qkv_bias=qkv_bias,
            o=self.o_proj.weight,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            attention_dtype=self.attention_dtype,
        )


@dataclass(frozen=True, slots=True)
class AttentionParts:
    qkv: torch.Tensor  # [(heads + 2 * kv_heads) * head_dim, input_size]: q, then k, then v
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    num_heads: int
    num_kv_heads: int
    head_dim: int
    attention_dtype: torch.dtype | None


def attend(
    parts: AttentionParts,
    x: torch.Tensor,  # [B, Q, input_size]
    rotary: tuple[torch.Tensor, torch.Tensor],
    attn_bias: torch.Tensor | None,  # [B, 1, Q, past + Q] float additive, None = causal
    cache,  # anything with transformers' ``update(keys, values, layer_index)``, or None
) -> torch.Tensor:
    batch, q_len, _ = x.shape
    heads, kv_heads = parts.num_heads, parts.num_kv_heads
    qkv = F.linear(x, parts.qkv, parts.qkv_bias)  # q, then k, then v heads
    qkv = qkv.view(batch, q_len, heads + 2 * kv_heads, parts.head_dim).transpose(1, 2)
    rotated = apply_rotary(qkv[:, : heads + kv_heads], *rotary)
    q, k = rotated.split([heads, kv_heads], dim=1)
    v = qkv[:, heads + kv_heads :]
    if parts.attention_dtype is not None:
        q, k, v = (t.to(parts.attention_dtype) for t in (q, k, v))
    if cache is not None:
        k, v = cache.update(k, v, 0)
    # A whole sequence from an empty cache is plain causal attention: SDPA's causal path,
    # without a [Q, Q] mask; with a prefix, the causal mask is offset by it.
    causal = attn_bias is None and q_len > 1
    from_empty = causal and k.shape[2] == q_len
    if causal and not from_empty:
        attn_bias = causal_bias(q_len, k.shape[2], q.dtype, q.device)
    mask = attn_bias.to(q.dtype) if attn_bias is not None else None  # one query sees all
    # grouped KV heads are shared inside the kernel instead of copied per query head
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=from_empty, enable_gqa=heads != kv_heads
    )
    return F.linear(out.transpose(1, 2).reshape(batch, q_len, -1).to(x.dtype), parts.o)


@dataclass(frozen=True, slots=True)
class LayerParts:
    """A head layer's tensors past its input: attention, the post-attention norm, the MLP."""

    attention: AttentionParts
    post_norm: torch.Tensor
    eps: float
    mlp: tuple[torch.Tensor, torch.Tensor]  # (gate/up stacked, down)

    @classmethod
    def of(cls, attention: Attention, post_norm: RMSNorm, mlp: GatedMLP) -> LayerParts:
        return cls(attention.parts(), post_norm.weight, post_norm.eps, mlp.parts())


def decoder_layer(
    parts: LayerParts,
    attn_in: torch.Tensor,  # [B, Q, input_size] what attention reads
    residual: torch.Tensor,  # [B, Q, H] what its output is added to
    rotary: tuple[torch.Tensor, torch.Tensor],
    attn_bias: torch.Tensor | None,
    cache,
) -> torch.Tensor:
    x = residual + attend(parts.attention, attn_in, rotary, attn_bias, cache)
    return x + gated_mlp(normalize(x, parts.post_norm, parts.eps), *parts.mlp)


def causal_bias(q_len: int, kv_len: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[1, 1, q_len, kv_len] additive mask: the last q_len keys are the queries themselves."""
    past = kv_len - q_len
    rows = torch.arange(q_len, device=device)[:, None] + past
    cols = torch.arange(kv_len, device=device)[None, :]
    bias = torch.zeros(q_len, kv_len, dtype=dtype, device=device)
    bias.masked_fill_(cols > rows, torch.finfo(dtype).min)
    return bias[None, None]


class GatedMLP(nn.Module):
    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.gate_up = StackedLinears(self.gate_proj, self.up_proj)

    def parts(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate/up stacked, down): the fused matrix at inference once fused."""
        return self.gate_up.product_weights()[0], self.down_proj.weight


def gated_mlp(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, down)
