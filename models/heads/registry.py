"""HeadKind -> head class. Anything unknown is an error, never a silent fallback."""

from __future__ import annotations

from models.errors import CheckpointError
from models.heads.base import DraftHead
from models.heads.config import HeadKind
from models.heads.eagle1 import Eagle1Head
from models.heads.eagle3 import Eagle3Head

_CLASSES: dict[HeadKind, type[DraftHead]] = {
    HeadKind.EAGLE1: Eagle1Head,
    HeadKind.EAGLE3: Eagle3Head,
}


def head_class(kind: HeadKind) -> type[DraftHead]:
    try:
        return _CLASSES[HeadKind(kind)]
    except (KeyError, ValueError) as err:
        raise CheckpointError(f"unknown head kind {kind!r}") from err
