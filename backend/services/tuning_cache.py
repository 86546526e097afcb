"""What the round auto-tuner learned of a pair, kept on disk beside its calibration, so that the
first reply after a relaunch starts from every arm's measured tokens and round times instead of
the prior, which otherwise costs that reply its first rounds.

Entries are keyed like the calibration (weights, device, dtype, quantization, threads, torch):
``$EAGLECHAT_CACHE_DIR/tuning/<digest>.json``. Saving is best effort and happens when a pair is
unloaded and when the process exits; a damaged entry is ignored (the tuner starts afresh).
"""

from __future__ import annotations

import atexit
import json
import logging
from pathlib import Path
from typing import get_args

from backend.config import DraftSources
from backend.engine.autotune import TreePolicy
from backend.engine.engine import Engine
from backend.services.cache_home import cache_home, keep, key_digest

logger = logging.getLogger(__name__)

TUNING_FORMAT = 5  # bump when what is saved changes
Policies = dict[tuple[bool, str], TreePolicy]  # by (sampled, draft sources), as Engine keeps them
_at_exit: dict[Path, tuple[Policies, dict]] = {}  # what to save at exit, by entry


def _entry(key: dict) -> Path:
    return cache_home() / "tuning" / f"{key_digest({**key, 'tuning': TUNING_FORMAT})}.json"


def restore(engine: Engine, key: dict, with_times: bool) -> bool:
    """Give ``engine`` the policies saved under ``key``; ``with_times`` False when its costs
    were timed again at this load (the saved time factors are relative to the old ones)."""
    path, restored = _entry(key), False
    try:
        for sampled, drafts, learned in json.loads(path.read_text()):
            if not isinstance(sampled, bool) or drafts not in get_args(DraftSources):
                raise ValueError(f"unknown policy {sampled!r}, {drafts!r}")
            policy = engine.tree_policy(sampled, drafts)
            if policy is not None:
                policy.restore(learned, with_times)
                restored = True
    except FileNotFoundError:
        return False
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        logger.warning("ignoring the unreadable tuning state %s: %s", path, err)
        return False
    return restored


def save(policies: Policies, key: dict) -> None:
    """Best effort: a read-only or full disk (or a reply still decoding while the process
    ends, changing the estimates under the copy) only means starting from less next time."""
    try:
        learned = [[*kind, policy.learned()] for kind, policy in policies.items()]
    except RuntimeError as err:
        logger.warning("could not save the tuning state: %s", err)
        return
    if learned:
        text = json.dumps(learned)
        keep(_entry(key), lambda partial: partial.write_text(text), "the tuning state")


def forget(key: dict) -> None:
    """Delete what was saved under ``key`` (the user reset the tuner): the next load of the
    pair starts from the prior. Raises OSError when the entry exists but cannot be removed."""
    _entry(key).unlink(missing_ok=True)


def save_at_exit(policies: Policies, key: dict) -> None:
    """Save ``policies`` (an engine's, which it fills as it decodes) when the process ends,
    whether or not their engine still exists then (a command-line run drops it before). Only
    the policies, not the engine, are kept for this; a later load of the same pair replaces an
    earlier one's."""
    if not _at_exit:
        atexit.register(_save_all)
    _at_exit[_entry(key)] = (policies, key)


def _save_all() -> None:
    for policies, key in _at_exit.values():
        save(policies, key)
