"""Forwards of an UNMODIFIED transformers causal LM: prefill, tree verification, plain steps.

Tree attention goes through the model's public inputs only: a float additive 4D mask (one per
layer type for hybrid sliding-window models, see attention_layout.py) and explicit position ids. Features for the draft head are captured by hooks (models/features.py).
Logits are computed only for the rows that are needed (``logits_to_keep``), never for a whole
prompt.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from dataclasses import dataclass

import torch
from torch import nn

from backend.engine import kv
from backend.engine.attention_layout import AttentionLayout
from backend.engine.tree import DraftTree, tree_position_ids
from models.features import FeatureCapture, decoder_of
from models.heads.base import execution_device


@dataclass(frozen=True, slots=True)
class TargetStep:
    logits: torch.Tensor  # [N, V] one row per input position kept
    features: torch.Tensor | None  # [N, F] head features per input position, None if not asked


class TargetRunner:
    """Owns nothing but the model; the cache is passed in so one runner serves many requests."""

    def __init__(self, model: nn.Module, feature_indices: tuple[int, ...] = ()) -> None:
        self.model = model
        self.config = model.config
        decoder = decoder_of(model)
        self.num_layers = len(decoder.layers)
        self.device = execution_device(model.get_input_embeddings())  # offloaded: its hook's
        self.dtype = _compute_dtype(model)
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.max_positions = int(getattr(self.config, "max_position_embeddings", 0) or 0)
        self.layout = AttentionLayout.of(self.config, model)
        self._capture = FeatureCapture(model, feature_indices) if feature_indices else None
        self._cache_keyword = cache_keyword(model)
        if _all_on_cpu(model):
            _grouped_attention_with_masks()

    def new_cache(self):
        return kv.new_cache(self.layout.layer_windows)

    @torch.inference_mode()
    def prefill(self, prompt_ids: torch.Tensor, cache, with_features: bool) -> TargetStep:
        """Process the prompt [n]; logits for the last position only, features for all."""
        ids = prompt_ids.to(self.device)[None]
        return self._run(ids, None, None, cache, logits_to_keep=1, with_features=with_features)

    @torch.inference_mode()
    def verify(self, tree: DraftTree, cache, with_features: bool) -> TargetStep:
        """One forward over all tree nodes with tree attention; logits and features per node."""
        committed = kv.cache_length(cache)
        if tree.is_chain:
            bias, positions = None, None  # a chain is causal: the model builds its own masks
        else:
            bias = self.layout.tree_masks(tree, committed, self.dtype, self.device)
            positions = tree_position_ids(tree, committed, self.device)
        ids = tree.token_ids.to(self.device)[None]
        return self._run(ids, bias, positions, cache, logits_to_keep=0, with_features=with_features)

    def _run(
        self, ids, bias, positions, cache, logits_to_keep: int, with_features: bool
    ) -> TargetStep:
        capture = self._capture if with_features else None
        with capture if capture is not None else contextlib.nullcontext():
            out = self.model(
                input_ids=ids,
                attention_mask=bias,
                position_ids=positions,
                **{self._cache_keyword: cache},
                use_cache=True,
                logits_to_keep=logits_to_keep,
            )
        features = capture.features()[0] if capture is not None else None
        return TargetStep(logits=out.logits[0], features=features)


def cache_keyword(model: nn.Module) -> str:
    """The forward's name for the KV cache: ``cache`` in current transformers, where
    ``past_key_values`` is a deprecated alias; releases before the rename (5.17, say) take only
    ``past_key_values`` and would silently ignore ``cache``, running every step without it."""
    parameters = inspect.signature(type(model).forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def _all_on_cpu(model: nn.Module) -> bool:
    return all(p.device.type == "cpu" for p in model.parameters())


def _grouped_attention_with_masks() -> None:
    """Let transformers hand grouped (GQA) keys and values to SDPA as they are even with a
    mask. By default it copies them once per query head whenever a mask is given, and every
    verification of several tokens has one (a chain's causal offset, a tree's mask): a copy of
    each layer's whole cache per round, which a one-token step (no mask) never pays. On a CPU
    SDPA takes grouped heads with a mask directly (on CUDA that falls back to a slow kernel, so
    only a process whose model runs on the CPU asks); an explicit setting is left alone."""
    os.environ.setdefault("TRANSFORMERS_SDPA_FORCE_GQA", "1")


def _compute_dtype(model: nn.Module) -> torch.dtype:
    """The dtype activations run in (bitsandbytes models keep a float compute dtype)."""
    for param in model.parameters():
        if param.dtype.is_floating_point:
            return param.dtype
    return torch.float32
