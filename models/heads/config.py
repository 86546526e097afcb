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

from backend.errors import CheckpointError


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
        "bias qkv_bias max_position_embeddings hidden_act architectures"
    ).split()

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
        extra = {k: v for k, v in raw.items() if k not in cls._KNOWN and k != "kind"}
        return cls(kind=kind, extra=extra, **values)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("extra")
        data["kind"] = self.kind.value
        if not data["architectures"]:
            data["architectures"] = (
                ["LlamaForCausalLMEagle3"] if self.kind is HeadKind.EAGLE3 else ["LlamaForCausalLM"]
            )
        if self.kind is HeadKind.EAGLE1:
            data.pop("draft_vocab_size")
            data.pop("target_hidden_size")
        data["model_type"] = "llama"
        return {**self.extra, **data}

    def save(self, directory: Path) -> None:
        (directory / "config.json").write_text(json.dumps(self.to_dict(), indent=2) + "\n")


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
    )
