"""EAGLE-3 draft head: fuses the inputs of target layers 2, L//2 and L-3 through
``fc`` (3*Ht -> H), runs one ``midlayer`` whose attention reads
concat(input_layernorm(embedding), hidden_norm(hidden)), and predicts over its own (possibly
reduced) draft vocabulary mapped back to target ids through ``d2t``.

Inside a draft tree the head feeds back its own pre-norm output as the next hidden state,
without ``fc``: only target features are projected.
"""

from __future__ import annotations

import torch
from torch import nn

from models.heads.base import DraftHead, DraftStep
from models.heads.config import HeadConfig, HeadKind, default_eagle3_layer_ids
from models.heads.layers import (
    Attention,
    GatedMLP,
    LayerParts,
    RMSNorm,
    Rotary,
    decoder_layer,
    normalize,
    rotary_angles,
)

MIN_TARGET_LAYERS = 7  # layer L-3 must come after L//2 and layer 2


class Eagle3MidLayer(nn.Module):
    """The midlayer's parameters under their checkpoint names; its arithmetic is the head's
    ``draft_step``: attention over [norm(embedding); norm(hidden)], residual on the hidden
    state, then a gated MLP."""

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.input_layernorm = RMSNorm(hidden, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(hidden, config.rms_norm_eps)
        self.self_attn = Attention(config, input_size=2 * hidden)
        self.post_attention_layernorm = RMSNorm(hidden, config.rms_norm_eps)
        self.mlp = GatedMLP(config)


class Eagle3Head(DraftHead):
    kind = HeadKind.EAGLE3

    def __init__(self, config: HeadConfig, with_embedding: bool = False) -> None:
        super().__init__(config)
        hidden = config.hidden_size
        if with_embedding:
            self.embed_tokens = nn.Embedding(config.vocab_size, hidden)
            self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(3 * config.target_hidden_size, hidden, bias=False)
        self.midlayer = Eagle3MidLayer(config)
        self.norm = RMSNorm(hidden, config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, config.draft_vocab_size, bias=False)
        self.rotary = Rotary(config)
        if config.has_reduced_vocab:
            self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
            self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))

    def feature_layers(self, num_target_layers: int) -> tuple[int, ...]:
        """The layer ids the config names (as vLLM honours them), else 2, L//2, L-3."""
        named = self.config.eagle_aux_hidden_state_layer_ids
        return tuple(named) if named is not None else default_eagle3_layer_ids(num_target_layers)

    def project(self, target_features: torch.Tensor) -> torch.Tensor:
        return self.fc(target_features.to(self.fc.weight.dtype))

    def draft_step(self) -> DraftStep:
        layer = self.midlayer
        embed, inv_freq = self.embedder(), self.rotary.inv_freq
        parts = LayerParts.of(layer.self_attn, layer.post_attention_layernorm, layer.mlp)
        input_norm, hidden_norm = layer.input_layernorm.weight, layer.hidden_norm.weight
        eps = parts.eps

        def step(hidden, token_ids, position_ids, attn_bias, cache) -> torch.Tensor:
            embedded = normalize(embed(token_ids), input_norm, eps)
            attn_in = torch.cat([embedded, normalize(hidden, hidden_norm, eps)], dim=-1)
            rotary = rotary_angles(position_ids, inv_freq)
            return decoder_layer(parts, attn_in, hidden, rotary, attn_bias, cache)

        return step

    def logits(self, hidden_out: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden_out))

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        if not self.config.has_reduced_vocab:
            return draft_ids
        return draft_ids + self.d2t[draft_ids]
