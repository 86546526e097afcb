"""Head-versus-target checks before anything is bound: each mismatch is an
IncompatibleHeadError naming both values, instead of a shape error deep inside a forward."""

from __future__ import annotations

from typing import Any

from backend.errors import IncompatibleHeadError
from models.heads.config import HeadConfig, HeadKind
from models.heads.eagle3 import MIN_TARGET_LAYERS


def _target_vocab(target_config: Any) -> int:
    return int(target_config.vocab_size)


def check_head_fits_target(head: HeadConfig, target_config: Any, head_name: str = "head") -> None:
    problems: list[str] = []
    target_hidden = int(target_config.hidden_size)
    target_vocab = _target_vocab(target_config)
    target_layers = int(target_config.num_hidden_layers)
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
    if problems:
        raise IncompatibleHeadError(
            f"{head_name} ({head.kind.value}) does not fit this target: " + "; ".join(problems),
            hint="pick the head trained for this exact target model (see the catalog)",
        )
