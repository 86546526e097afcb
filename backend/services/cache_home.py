"""Where EagleChat keeps what it measured or converted once: ``$EAGLECHAT_CACHE_DIR``, default
``~/.cache/eaglechat``; each entry is named by a digest of everything it depends on."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def cache_home() -> Path:
    return Path(os.environ.get("EAGLECHAT_CACHE_DIR") or Path.home() / ".cache" / "eaglechat")


def key_digest(key: dict) -> str:
    """A short, stable name for a JSON-ready cache key (any change to the key changes it)."""
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
