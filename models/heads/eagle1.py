"""EAGLE-1/2 draft head: fc over [token embedding; target feature] followed by one
Llama decoder layer without input norm; logits come from the target's own lm_head.

The feature is the target's final normed hidden state, so the head predicts the next one and
the target's lm_head reads it directly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models.heads.base import DraftHead, DraftStep
from models.heads.config import HeadConfig, HeadKind
from models.heads.layers import (
    Attention,
    GatedMLP,
    LayerParts,
    RMSNorm,
    Rotary,
    decoder_layer,
    rotary_angles,
)


class Eagle1DecoderLayer(nn.Module):
    """A Llama decoder layer minus ``input_layernorm`` (fc output goes straight to attention),
    as parameters under their checkpoint names; its arithmetic is the head's ``draft_step``."""

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.self_attn = Attention(config, input_size=config.hidden_size)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = GatedMLP(config)


class Eagle1Head(DraftHead):
    kind = HeadKind.EAGLE1

    def __init__(self, config: HeadConfig, with_embedding: bool = False) -> None:
        super().__init__(config)
        hidden = config.hidden_size
        if with_embedding:
            self.embed_tokens = nn.Embedding(config.vocab_size, hidden)
            self.embed_tokens.weight.requires_grad_(False)  # frozen copy of the target's
        self.fc = nn.Linear(2 * hidden, hidden, bias=config.bias)
        self.layers = nn.ModuleList([Eagle1DecoderLayer(config)])
        self.rotary = Rotary(config)

    def feature_layers(self, num_target_layers: int) -> tuple[int, ...]:
        return (num_target_layers,)

    def project(self, target_features: torch.Tensor) -> torch.Tensor:
        return target_features  # the feature space is the target's hidden space

    def draft_step(self) -> DraftStep:
        layer = self.layers[0]
        embed, inv_freq = self.embedder(), self.rotary.inv_freq
        parts = LayerParts.of(layer.self_attn, layer.post_attention_layernorm, layer.mlp)
        fc_weight, fc_bias = self.fc.weight, self.fc.bias

        def step(hidden, token_ids, position_ids, attn_bias, cache) -> torch.Tensor:
            embedded = embed(token_ids)  # [1, Q, H]
            fc_in = torch.cat([embedded, hidden.to(embedded.dtype)], dim=-1)
            x = F.linear(fc_in, fc_weight, fc_bias)
            rotary = rotary_angles(position_ids, inv_freq)
            return decoder_layer(parts, x, x, rotary, attn_bias, cache)

        return step

    def logits(self, hidden_out: torch.Tensor) -> torch.Tensor:
        lm_head = self._borrowed.get("lm_head")
        if lm_head is None:
            raise RuntimeError("EAGLE-1 head needs the target's lm_head: call bind_target first")
        return lm_head(hidden_out.to(*self._lm_head_input))
