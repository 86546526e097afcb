"""Capture draft-head features from any stock transformers decoder, without modifying it.

Index convention is transformers' ``hidden_states``: index i < L is the INPUT of decoder layer i
(the pre-norm residual stream), index L is the decoder's final normed output. EAGLE-1/2 reads
(L,), EAGLE-3 reads (2, L//2, L-3). Inputs of layers are taken with forward pre-hooks on the
model's own decoder layers, so this works for every architecture that exposes
``get_decoder().layers`` (Llama, Qwen2/3, Mistral, Mixtral, Gemma, ...).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from models.errors import IncompatibleHeadError


def decoder_of(model: nn.Module) -> nn.Module:
    """The base decoder (embeddings + layers + final norm) of a causal LM."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    if decoder is None or not hasattr(decoder, "layers"):
        raise IncompatibleHeadError(
            f"{type(model).__name__} does not expose its decoder layers",
            hint="EAGLE needs a decoder-only transformers model (get_decoder().layers)",
        )
    return decoder


class FeatureCapture:
    """Records the requested hidden states during a forward; use as a context manager."""

    def __init__(self, model: nn.Module, indices: Sequence[int]) -> None:
        self.decoder = decoder_of(model)
        self.num_layers = len(self.decoder.layers)
        bad = [i for i in indices if not 0 <= i <= self.num_layers]
        if bad:
            raise IncompatibleHeadError(
                f"head needs target hidden states {list(indices)} but the target has only "
                f"{self.num_layers} layers"
            )
        self.indices = tuple(indices)
        self._captured: dict[int, torch.Tensor] = {}
        self._handles: list = []

    def __enter__(self) -> FeatureCapture:
        self._captured.clear()
        for index in self.indices:
            if index < self.num_layers:
                hook = self._make_pre_hook(index)
                self._handles.append(
                    self.decoder.layers[index].register_forward_pre_hook(hook, with_kwargs=True)
                )
            else:
                self._handles.append(self.decoder.register_forward_hook(self._final_hook))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _make_pre_hook(self, index: int):
        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            self._captured[index] = hidden
            return None

        return hook

    def _final_hook(self, module, args, output) -> None:
        hidden = getattr(output, "last_hidden_state", None)
        self._captured[self.num_layers] = hidden if hidden is not None else output[0]

    def features(self) -> torch.Tensor:
        """The captured states concatenated low->high: [B, S, len(indices) * H]."""
        parts = [self._captured[index] for index in self.indices]
        device = parts[-1].device
        parts = [part.to(device) for part in parts]
        self._captured.clear()
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
