"""Where EagleChat keeps what it measured or converted once: ``$EAGLECHAT_CACHE_DIR``, default
``~/.cache/eaglechat``; each entry is named by a digest of everything it depends on."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

logger = logging.getLogger(__name__)


def cache_home() -> Path:
    return Path(os.environ.get("EAGLECHAT_CACHE_DIR") or Path.home() / ".cache" / "eaglechat")


def key_digest(key: dict) -> str:
    """A short, stable name for a JSON-ready cache key (any change to the key changes it)."""
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]


def keep(path: Path, write: Callable[[Path], None], what: str) -> None:
    """Write one entry whole or not at all: ``write`` fills a file beside ``path``, which then
    replaces it. Best effort: a read-only or full disk only means measuring again later, so it
    is logged, not raised, and no half-written file is left behind."""
    partial = path.with_name(path.name + ".partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(partial)
        partial.replace(path)
    except OSError as err:
        logger.warning("could not keep %s at %s: %s", what, path, err)
        with suppress(OSError):  # a folder that could not be made holds no partial file
            partial.unlink(missing_ok=True)
