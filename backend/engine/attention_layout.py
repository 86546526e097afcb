"""Which attention each target layer uses, so tree verification masks every layer exactly as the
model itself would for sequential decoding.

Hybrid models (Gemma 2/3, gpt-oss, Cohere2, Qwen2 with ``use_sliding_window``) mix full and
sliding-window layers, named by ``config.layer_types``; Mistral-style configs window every layer
through ``sliding_window`` alone. Their transformers implementations take a mapping from layer
type to mask, so each type gets its own tree mask. Layers whose state is recurrent (SSM,
linear attention, convolutions) cannot be rolled back to an accepted path: such targets are
refused from their config alone, before any weight is read.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

from backend.engine.tree import DraftTree, tree_attention_bias
from backend.errors import IncompatibleHeadError

FULL = "full_attention"
SLIDING = "sliding_attention"
_ATTENTION_TYPES = (FULL, SLIDING)

# Model types whose layers carry recurrent state (all or some of them).
RECURRENT_MODEL_TYPES = frozenset(
    "mamba mamba2 falcon_mamba jamba zamba zamba2 bamba falcon_h1 granitemoehybrid nemotron_h "
    "recurrent_gemma rwkv xlstm lfm2 lfm2_moe qwen3_next minimax kimi_linear".split()
)
# Config keys that only recurrent or hybrid-recurrent models have.
_RECURRENT_KEYS = (
    "layers_block_type",
    "hybrid_override_pattern",
    "mamba_d_state",
    "ssm_cfg",
    "attn_layer_indices",
    "block_types",
    "linear_num_key_heads",
)


class UnsupportedTargetError(IncompatibleHeadError):
    """A target that tree verification cannot serve exactly."""

    code = "unsupported_target"


@dataclass(frozen=True, slots=True)
class AttentionLayout:
    """The window of each attention type the target uses (None = full attention)."""

    windows: dict[str, int | None]  # layer type -> window
    per_type_masks: bool  # the model takes {layer type: mask}; else one mask for every layer
    layer_windows: tuple[int | None, ...] = ()  # per layer (empty: full attention everywhere)

    @classmethod
    def of(cls, config: Any, model: Any = None) -> AttentionLayout:
        """Read the layout from a (text) config; ``model`` tells whether it takes mask maps."""
        check_rollback(config)
        text = getattr(config, "text_config", None)
        config = text if text is not None and hasattr(text, "hidden_size") else config
        window = getattr(config, "sliding_window", None) or None
        if getattr(config, "use_sliding_window", True) is False:
            window = None
        types = tuple(getattr(config, "layer_types", None) or ())
        if not types:
            kind = SLIDING if window else FULL
            layers = int(getattr(config, "num_hidden_layers", 0) or 0)
            return cls({kind: window}, per_type_masks=False, layer_windows=(window,) * layers)
        windows = {kind: (window if kind == SLIDING else None) for kind in sorted(set(types))}
        layer_windows = tuple(windows[kind] for kind in types)
        mixed = len({windows[kind] for kind in windows}) > 1
        if mixed and model is not None and not accepts_mask_mapping(model):
            raise UnsupportedTargetError(
                f"{type(model).__name__} mixes full and sliding-window layers but does not "
                "accept one attention mask per layer type",
                hint="this architecture needs a newer transformers, or run it without a head",
            )
        return cls(windows, per_type_masks=mixed, layer_windows=layer_windows)

    @property
    def uniform_window(self) -> int | None:
        """The window when every layer shares it (None: full attention or mixed)."""
        values = set(self.windows.values())
        return next(iter(values)) if len(values) == 1 else None

    def tree_masks(
        self, tree: DraftTree, committed: int, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        """The additive tree mask for every layer: one tensor, or one per layer type. A windowed
        layer's mask covers only the keys its cache shows (kv.WindowedLayer)."""
        built: dict[int | None, torch.Tensor] = {}
        for window in self.windows.values():
            if window not in built:
                built[window] = tree_attention_bias(tree, committed, dtype, device, window)
        if not self.per_type_masks:
            return next(iter(built.values()))
        return {kind: built[window] for kind, window in self.windows.items()}


def check_rollback(config: Any) -> None:
    """Refuse targets with recurrent layers: verification must be able to drop the rejected
    drafts' state, which only attention KV caches allow."""
    text = getattr(config, "text_config", None)
    config = text if text is not None and hasattr(text, "hidden_size") else config
    model_type = str(getattr(config, "model_type", ""))
    types = [str(t) for t in getattr(config, "layer_types", None) or ()]
    odd = sorted({t for t in types if t not in _ATTENTION_TYPES})
    keys = [k for k in _RECURRENT_KEYS if getattr(config, k, None) is not None]
    if model_type in RECURRENT_MODEL_TYPES or odd or keys:
        what = f"layer types {odd}" if odd else f"model type {model_type!r}"
        raise UnsupportedTargetError(
            f"{what}: this target keeps recurrent state (SSM, linear attention or convolution "
            "layers) that cannot be rolled back to an accepted draft, so EAGLE cannot verify "
            "draft trees on it exactly",
            hint="choose a transformer target with attention layers only "
            "(Llama, Qwen, Mistral, Gemma, ...)",
        )


def accepts_mask_mapping(model: Any) -> bool:
    """Whether the model's decoder takes ``attention_mask`` as {layer type: mask}."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    try:
        source = inspect.getsource(type(decoder).forward)
    except (OSError, TypeError):
        return False
    return "attention_mask, dict" in source
