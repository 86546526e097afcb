"""Head-versus-target checks before any target weight is read: each mismatch is an
IncompatibleHeadError naming both values, instead of a shape error deep inside a forward.

The target side is its ``config.json`` only (:func:`read_target_config`), so a wrong pairing of
a 70B target with an 8B head costs a few kilobytes of reading, not minutes of loading.
"""

from __future__ import annotations

import logging
from typing import Any

from backend.errors import ConfigError, IncompatibleHeadError
from backend.services.gguf_cache import converted_source
from backend.services.target_source import local_source
from models.heads.config import HeadConfig, HeadKind
from models.heads.eagle3 import MIN_TARGET_LAYERS

logger = logging.getLogger(__name__)


def read_target_config(path: str, trust_remote_code: bool = False) -> Any:
    """The target's transformers config, read from ``config.json`` (or a GGUF file's metadata)
    without touching weights."""
    from transformers import AutoConfig

    source = local_source(path)
    source = converted_source(source) or source
    try:
        return AutoConfig.from_pretrained(
            source.directory, trust_remote_code=trust_remote_code, **source.pretrained_kwargs()
        )
    except ImportError as err:  # GGUF reading needs the gguf package
        raise ConfigError(
            f"cannot read {source.display}: {err}",
            hint="pip install gguf (or pip install -e .[gemma])",
        ) from err
    except (OSError, ValueError, KeyError) as err:
        what = "GGUF file" if source.is_gguf else "config.json in"
        raise ConfigError(
            f"cannot read the target's {what} {source.display}: {err}",
            hint="is this a transformers model folder (config.json + weights) or a GGUF file?",
        ) from err


def text_config(target_config: Any) -> Any:
    """The language-model part of a config (multimodal configs nest it as ``text_config``)."""
    nested = getattr(target_config, "text_config", None)
    return nested if nested is not None and hasattr(nested, "hidden_size") else target_config


def target_architecture(target_config: Any) -> str:
    names = list(getattr(target_config, "architectures", None) or [])
    return ", ".join(names) or str(getattr(target_config, "model_type", "unknown"))


def is_causal_lm(target_config: Any) -> bool:
    """Decoder-only causal LMs are what EAGLE drafts for; encoder-decoders and encoders are not."""
    if getattr(target_config, "is_encoder_decoder", False):
        return False
    names = list(getattr(target_config, "architectures", None) or [])
    return not names or any(name.endswith("ForCausalLM") for name in names)


def check_head_fits_target(
    head: HeadConfig,
    target_config: Any,
    head_name: str = "head",
    expected_kind: str | None = None,
) -> None:
    """Raise one IncompatibleHeadError listing every mismatch, each with both values.

    ``expected_kind`` is what the caller was told the head is (e.g. by the catalog); the kind
    detected from the checkpoint's config and key names wins, and a difference is an error.
    """
    problems: list[str] = []
    if expected_kind is not None and expected_kind != head.kind.value:
        problems.append(f"head kind: expected {expected_kind}, the checkpoint is {head.kind.value}")
    if not is_causal_lm(target_config):
        problems.append(
            f"architecture: a {head.kind.value} head drafts for a decoder-only *ForCausalLM "
            f"target, target is {target_architecture(target_config)}"
        )
    text = text_config(target_config)
    target_hidden = int(text.hidden_size)
    target_vocab = int(text.vocab_size)
    target_layers = int(text.num_hidden_layers)
    if head.kind is HeadKind.EAGLE1 and head.hidden_size != target_hidden:
        problems.append(f"hidden size: head {head.hidden_size} vs target {target_hidden}")
    if head.kind is HeadKind.EAGLE3 and head.target_hidden_size != target_hidden:
        problems.append(
            f"target hidden size: head expects {head.target_hidden_size}, target has {target_hidden}"
        )
    if head.vocab_size != target_vocab:
        problems.append(f"vocabulary size: head {head.vocab_size} vs target {target_vocab}")
    if head.kind is HeadKind.EAGLE3 and target_layers < MIN_TARGET_LAYERS:
        problems.append(
            f"layers: an EAGLE-3 head needs a target with at least {MIN_TARGET_LAYERS} layers, "
            f"target has {target_layers}"
        )
    layer_ids = head.eagle_aux_hidden_state_layer_ids
    if head.kind is HeadKind.EAGLE3 and layer_ids and max(layer_ids) >= target_layers:
        problems.append(
            f"feature layers: the head reads target layers {layer_ids}, target has "
            f"{target_layers} layers"
        )
    if problems:
        raise IncompatibleHeadError(
            f"{head_name} ({head.kind.value}) does not fit this target: " + "; ".join(problems),
            hint="pick the head trained for this exact target model (see the catalog)",
        )
    logger.debug("%s fits the target (%s)", head_name, target_architecture(target_config))
