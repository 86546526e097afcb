"""Where EagleChat keeps what it measured or converted once: ``$EAGLECHAT_CACHE_DIR``, default
``~/.cache/eaglechat``."""

from __future__ import annotations

import os
from pathlib import Path


def cache_home() -> Path:
    return Path(os.environ.get("EAGLECHAT_CACHE_DIR") or Path.home() / ".cache" / "eaglechat")
