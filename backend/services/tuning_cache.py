"""What the tree auto-tuner learned of a pair, kept on disk beside its calibration, so that the
first reply after a relaunch starts from the head's measured acceptance (per depth, per sibling
rank, per shape) instead of the prior, which otherwise costs that reply its first rounds.

Entries are keyed like the calibration (weights, device, dtype, quantization, threads, torch):
``$EAGLECHAT_CACHE_DIR/tuning/<digest>.json``. Saving is best effort and happens when a pair is
unloaded and when the process exits; a damaged entry is ignored (the tuner starts afresh).
"""

from __future__ import annotations

import atexit
import json
import logging
from pathlib import Path

from backend.engine.autotune import TreePolicy
from backend.engine.engine import Engine
from backend.services.cache_home import cache_home, key_digest

logger = logging.getLogger(__name__)

TUNING_FORMAT = 2  # bump when what TreePolicy.learned() holds changes
_NAMES = {False: "greedy", True: "sampled"}  # one policy per greedy and sampled decoding
_at_exit: dict[Path, tuple[dict[bool, TreePolicy], dict]] = {}  # what to save at exit, by entry


def _entry(key: dict) -> Path:
    return cache_home() / "tuning" / f"{key_digest({**key, 'tuning': TUNING_FORMAT})}.json"


def restore(engine: Engine, key: dict, with_times: bool) -> bool:
    """Give ``engine`` the policies saved under ``key``; ``with_times`` False when its costs
    were timed again at this load (the saved time factors are relative to the old ones)."""
    costs = engine.tree_costs()  # None without a drafter: nothing to tune
    if costs is None:
        return False
    path = _entry(key)
    try:
        saved = json.loads(path.read_text())
        policies = {}
        for sampled, name in _NAMES.items():
            if name in saved:
                policies[sampled] = TreePolicy.for_decoding(costs, sampled)
                policies[sampled].restore(saved[name], with_times)
    except FileNotFoundError:
        return False
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        logger.warning("ignoring the unreadable tuning state %s: %s", path, err)
        return False
    engine.policies.update(policies)
    return bool(policies)


def save(policies: dict[bool, TreePolicy], key: dict) -> None:
    """Best effort: a read-only or full disk (or a reply still decoding while the process
    ends, changing the estimates under the copy) only means starting from less next time."""
    path = _entry(key)
    try:
        learned = {_NAMES[sampled]: policy.learned() for sampled, policy in policies.items()}
        if not learned:
            return
        text = json.dumps(learned)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    except (OSError, RuntimeError) as err:
        logger.warning("could not save the tuning state to %s: %s", path, err)


def forget(key: dict) -> None:
    """Delete what was saved under ``key`` (the user reset the tuner): the next load of the
    pair starts from the prior. Raises OSError when the entry exists but cannot be removed."""
    _entry(key).unlink(missing_ok=True)


def save_at_exit(policies: dict[bool, TreePolicy], key: dict) -> None:
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
