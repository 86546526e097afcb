"""Online or offline for this run: offline only when asked, or when the Hub cannot be reached.

Forcing ``HF_HUB_OFFLINE=1`` at start would make every download fail; staying online without a
network would make each Hub lookup wait for its own timeout. So the app decides once, at start:

- asked (``--offline``, or ``HF_HUB_OFFLINE=1`` already set): offline, nothing is probed;
- otherwise one TCP connection to the Hub endpoint (``HF_ENDPOINT`` or huggingface.co), bounded
  by ``timeout_s`` including the name lookup: if it fails, offline for this run.

Going offline sets ``HF_HUB_OFFLINE=1`` in this process's environment (read at call time by
``hub.py`` and ``planning.py``) and huggingface_hub's own flag (read at import by it and by
transformers). Local folders and cached models load either way.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from urllib.parse import urlsplit

from huggingface_hub import constants

logger = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "https://huggingface.co"
PROBE_TIMEOUT_S = 3.0
_TRUE = {"1", "ON", "YES", "TRUE"}


def offline_env() -> bool:
    """Whether ``HF_HUB_OFFLINE`` asks for offline mode in this process's environment."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in _TRUE


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "").rstrip("/") or DEFAULT_ENDPOINT


def hub_reachable(endpoint: str | None = None, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the Hub's host opens within ``timeout_s``.

    The probe runs in a daemon thread because a name lookup ignores socket timeouts: without
    a network it could otherwise hang for much longer than the bound."""
    parts = urlsplit(endpoint or hub_endpoint())
    if not parts.hostname:
        return False
    port = parts.port or (443 if parts.scheme == "https" else 80)
    result: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((parts.hostname, port), timeout=timeout_s):
                result.append(True)
        except OSError as err:
            logger.info("Hub probe of %s:%s failed: %s", parts.hostname, port, err)

    thread = threading.Thread(target=probe, name="hub-probe", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return bool(result)


def go_offline() -> None:
    """Offline mode for the rest of this process."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    constants.HF_HUB_OFFLINE = True


def choose_hub_mode(asked_offline: bool = False, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Decide once per run (see the module docstring); returns why the run is offline, or
    None when it is online."""
    if asked_offline:
        go_offline()
        return "offline mode was asked for (--offline)"
    if offline_env():
        go_offline()
        return "offline mode was asked for (HF_HUB_OFFLINE=1)"
    if not hub_reachable(timeout_s=timeout_s):
        go_offline()
        return f"the Hub ({hub_endpoint()}) could not be reached"
    return None
