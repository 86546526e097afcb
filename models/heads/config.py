"""Draft-head configuration: parsed from the official ``config.json`` of EAGLE-1/2, EAGLE-3 and
SpecForge heads, written back in the same format.

The head kind is detected from the config and the checkpoint's key names, never from a user
flag (see :func:`detect_kind`).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from models.errors import CheckpointError


class HeadKind(str, enum.Enum):
    EAGLE1 = "eagle1"  # EAGLE-1/2: fc over [embedding; last feature] + one decoder layer
    EAGLE3 = "eagle3"  # EAGLE-3: fc over 3 fused target layers + midlayer + own lm_head


EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")


@dataclass(slots=True)
class HeadConfig:
    """Shapes and options of a draft head. Field names follow the official config.json keys."""

    kind: HeadKind
    hidden_size: int  # H of the head (equals the target's for EAGLE-1)
    intermediate_size: int  # MLP width
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int  # target vocabulary V
    head_dim: int = 0  # 0 = hidden_size // num_attention_heads
    draft_vocab_size: int = 0  # EAGLE-3 lm_head rows Vd; 0 = vocab_size
    target_hidden_size: int = 0  # EAGLE-3 fc input is 3 * this; 0 = hidden_size
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # {"rope_type": "llama3" | "linear", ...}
    bias: bool = True  # EAGLE-1 fc bias ("bias": false in Llama-3 heads)
    qkv_bias: bool = False  # q/k/v biases (Qwen2 heads)
    max_position_embeddings: int = 4096
    hidden_act: str = "silu"
    architectures: list[str] = field(default_factory=list)
    # EAGLE-3: hidden_states indices of the target read by fc (vLLM's key); None = 2, L//2, L-3
    eagle_aux_hidden_state_layer_ids: list[int] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # unknown keys, written back unchanged

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.draft_vocab_size == 0:
            self.draft_vocab_size = self.vocab_size
        if self.target_hidden_size == 0:
            self.target_hidden_size = self.hidden_size
        if self.hidden_act not in ("silu", "swish"):
            raise CheckpointError(f"unsupported head activation {self.hidden_act!r} (only silu)")
        if self.num_attention_heads % self.num_key_value_heads:
            raise CheckpointError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )

    @property
    def has_reduced_vocab(self) -> bool:
        return self.kind is HeadKind.EAGLE3 and self.draft_vocab_size != self.vocab_size

    # ---- (de)serialisation -------------------------------------------------------------
    _KNOWN = (
        "hidden_size intermediate_size num_attention_heads num_key_value_heads vocab_size "
        "head_dim draft_vocab_size target_hidden_size rms_norm_eps rope_theta rope_scaling "
        "bias qkv_bias max_position_embeddings hidden_act architectures "
        "eagle_aux_hidden_state_layer_ids"
    ).split()
    # Keys every export rewrites from the head itself, so stale values never survive in extra.
    _EXPORTED = ("num_hidden_layers", "tie_word_embeddings", "torch_dtype", "model_type")

    @classmethod
    def from_dict(cls, raw: dict[str, Any], kind: HeadKind) -> HeadConfig:
        required = ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
        missing = [k for k in required if k not in raw]
        if missing:
            raise CheckpointError(f"head config.json lacks required keys: {', '.join(missing)}")
        values: dict[str, Any] = {k: raw[k] for k in cls._KNOWN if raw.get(k) is not None}
        values.setdefault("num_key_value_heads", raw["num_attention_heads"])
        rope_params = raw.get("rope_parameters")  # transformers 5 style
        if isinstance(rope_params, dict):
            values.setdefault("rope_theta", rope_params.get("rope_theta", 10000.0))
            if rope_params.get("rope_type", "default") != "default":
                values.setdefault("rope_scaling", dict(rope_params))
        scaling = values.get("rope_scaling")
        if scaling is not None:
            values["rope_scaling"] = _check_rope_scaling(scaling)
        layer_ids = values.get("eagle_aux_hidden_state_layer_ids")
        if layer_ids is None and isinstance(raw.get("eagle_config"), dict):  # SGLang's place
            layer_ids = raw["eagle_config"].get("eagle_aux_hidden_state_layer_ids")
        if layer_ids is not None:
            values["eagle_aux_hidden_state_layer_ids"] = _check_layer_ids(layer_ids)
        skipped = {*cls._KNOWN, *cls._EXPORTED, "kind", "rope_parameters"}
        extra = {k: v for k, v in raw.items() if k not in skipped}
        return cls(kind=kind, extra=extra, **values)

    def to_dict(self, saved_embedding: bool = False, dtype: str | None = None) -> dict[str, Any]:
        """The config.json that the reference code, SpecForge, vLLM and SGLang read as we do.

        ``saved_embedding``: the weights file carries ``embed_tokens.weight``. ``dtype``: the
        dtype of the saved weights, for loaders that read ``torch_dtype``.
        """
        data = asdict(self)
        data.pop("extra")
        data["kind"] = self.kind.value
        if not data["architectures"]:
            data["architectures"] = (
                ["LlamaForCausalLMEagle3"] if self.kind is HeadKind.EAGLE3 else ["LlamaForCausalLM"]
            )
        # Loaders that build layers from the config default to a full model's 32 layers.
        data["num_hidden_layers"] = 1
        data["tie_word_embeddings"] = False
        data["rope_scaling"] = _both_rope_spellings(self.rope_scaling)
        if dtype is not None:
            data["torch_dtype"] = dtype
        if self.kind is HeadKind.EAGLE1:
            data.pop("draft_vocab_size")
            data.pop("target_hidden_size")
            data.pop("eagle_aux_hidden_state_layer_ids")
        else:
            # The reference EAGLE-3 code takes the target's embedding only when this key is
            # absent: write it only when the head differs from the target or ships its own.
            if self.target_hidden_size == self.hidden_size and not saved_embedding:
                data.pop("target_hidden_size")
            if self.eagle_aux_hidden_state_layer_ids is None:
                data.pop("eagle_aux_hidden_state_layer_ids")
            else:  # SGLang reads the layer ids only from eagle_config, vLLM from either
                nested = self.extra.get("eagle_config")
                data["eagle_config"] = {
                    **(nested if isinstance(nested, dict) else {}),
                    "use_aux_hidden_state": True,
                    "eagle_aux_hidden_state_layer_ids": self.eagle_aux_hidden_state_layer_ids,
                }
        data["model_type"] = "llama"
        return {**self.extra, **data}

    def save(
        self, directory: Path, saved_embedding: bool = False, dtype: str | None = None
    ) -> None:
        text = json.dumps(self.to_dict(saved_embedding, dtype), indent=2) + "\n"
        (directory / "config.json").write_text(text)


def _both_rope_spellings(scaling: dict[str, Any] | None) -> dict[str, Any] | None:
    """rope_scaling as every loader reads it. The reference code indexes ``type`` and accepts
    exactly the two keys ``type`` and ``factor`` (linear and dynamic only), which transformers,
    vLLM and SpecForge read too; other kinds carry both ``rope_type`` and ``type``."""
    if scaling is None or scaling.get("rope_type", "default") == "default":
        return None
    if scaling["rope_type"] == "linear":
        return {"type": "linear", "factor": float(scaling["factor"])}
    return {**scaling, "type": scaling["rope_type"]}


def _check_layer_ids(layer_ids: Any) -> list[int]:
    if not isinstance(layer_ids, list | tuple) or not all(isinstance(i, int) for i in layer_ids):
        raise CheckpointError(
            f"eagle_aux_hidden_state_layer_ids must be a list of layer indices, got {layer_ids!r}"
        )
    if list(layer_ids) != sorted(set(layer_ids)) or (layer_ids and layer_ids[0] < 0):
        raise CheckpointError(
            f"eagle_aux_hidden_state_layer_ids must increase from 0 up, got {list(layer_ids)}"
        )
    return list(layer_ids)


def _check_rope_scaling(scaling: dict[str, Any]) -> dict[str, Any]:
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "llama3":
        needed = (
            "factor",
            "low_freq_factor",
            "high_freq_factor",
            "original_max_position_embeddings",
        )
        missing = [k for k in needed if k not in scaling]
        if missing:
            raise CheckpointError(f"llama3 rope_scaling lacks {', '.join(missing)}")
    elif rope_type == "linear":
        if "factor" not in scaling:
            raise CheckpointError("linear rope_scaling lacks 'factor'")
    elif rope_type != "default":
        raise CheckpointError(
            f"unsupported rope_scaling type {rope_type!r} in head config",
            hint="supported: default, linear, llama3",
        )
    return {**scaling, "rope_type": rope_type}


def detect_kind(raw_config: dict[str, Any], keys: Iterable[str]) -> HeadKind:
    """Decide EAGLE-1/2 versus EAGLE-3 from the config and the weight names, never a flag."""
    key_set = set(keys)
    if any(k.startswith("layers.1.") for k in key_set):
        raise CheckpointError(
            "this checkpoint has several decoder layers: it looks like a full model, not a "
            "one-layer EAGLE draft head",
            hint="pass the target as --target and its EAGLE head as --head",
        )
    has_eagle3_keys = any(k.startswith("midlayer.") for k in key_set) or "d2t" in key_set
    has_eagle1_keys = any(k.startswith("layers.0.") for k in key_set)
    arch = raw_config.get("architectures") or []
    says_eagle3 = any(a in EAGLE3_ARCHITECTURES for a in arch) or "draft_vocab_size" in raw_config
    if has_eagle3_keys and has_eagle1_keys:
        raise CheckpointError("checkpoint mixes EAGLE-1 (layers.0.*) and EAGLE-3 (midlayer.*) keys")
    if has_eagle3_keys:
        return HeadKind.EAGLE3
    if has_eagle1_keys:
        if says_eagle3:
            raise CheckpointError(
                "config.json describes an EAGLE-3 head but the weights are EAGLE-1/2 (layers.0.*)"
            )
        return HeadKind.EAGLE1
    raise CheckpointError(
        "cannot tell the head kind: the checkpoint has neither EAGLE-1/2 keys (layers.0.*) "
        "nor EAGLE-3 keys (midlayer.*)",
        hint="is this a draft-head checkpoint? a full model cannot be used as a head",
    )


def head_config_for_target(
    target_config: Any,
    kind: HeadKind,
    draft_vocab_size: int | None = None,
    intermediate_size: int | None = None,
) -> HeadConfig:
    """A head config shaped for a transformers target config (for training or tests)."""
    hidden = target_config.hidden_size
    heads = target_config.num_attention_heads
    rope_theta = getattr(target_config, "rope_theta", None)
    rope_params = getattr(target_config, "rope_parameters", None)
    if rope_theta is None and isinstance(rope_params, dict):
        rope_theta = rope_params.get("rope_theta")
    return HeadConfig(
        kind=kind,
        hidden_size=hidden,
        intermediate_size=intermediate_size or target_config.intermediate_size,
        num_attention_heads=heads,
        num_key_value_heads=getattr(target_config, "num_key_value_heads", None) or heads,
        head_dim=getattr(target_config, "head_dim", None) or hidden // heads,
        vocab_size=target_config.vocab_size,
        draft_vocab_size=draft_vocab_size or 0,
        target_hidden_size=hidden,
        rms_norm_eps=getattr(target_config, "rms_norm_eps", 1e-6),
        rope_theta=float(rope_theta or 10000.0),
        bias=kind is HeadKind.EAGLE1,
        qkv_bias=bool(getattr(target_config, "attention_bias", False)),
        max_position_embeddings=getattr(target_config, "max_position_embeddings", 4096),
        eagle_aux_hidden_state_layer_ids=(
            list(default_eagle3_layer_ids(target_config.num_hidden_layers))
            if kind is HeadKind.EAGLE3
            else None
        ),
    )


def default_eagle3_layer_ids(num_target_layers: int) -> tuple[int, int, int]:
    """hidden_states indices = inputs of decoder layers 2, L//2, L-3 (low to high)."""
    return (2, num_target_layers // 2, num_target_layers - 3)
