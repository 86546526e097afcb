"""The catalog pair a command names with ``--pair``, and that pair's files on this machine.

    pair = chosen_pair(args)                # None without --pair
    head_dir = local_files(pair.head, "head")

``--pair NAME`` stands for the catalog's target and head, so it and ``--target`` exclude each
other in every command that takes both.
"""

from __future__ import annotations

import argparse
import logging

from backend.api import ProgressLog
from backend.engine.progress import drain
from backend.errors import ConfigError
from backend.services import planning
from backend.services.catalog import PairSpec, find_pair
from backend.services.hub import RepoKind

logger = logging.getLogger(__name__)


def chosen_pair(args: argparse.Namespace) -> PairSpec | None:
    """The catalog entry of ``--pair``, or None without it."""
    if not args.pair:
        return None
    if args.target:
        raise ConfigError("give --pair or --target, not both")
    return find_pair(args.pair)


def local_files(location: str, kind: RepoKind) -> str:
    """A pair's target or head on disk (a folder, or a GGUF file's path), found as a load finds
    it: bundled and cached files as they are, anything missing downloaded first (progress in
    the log)."""
    return drain(planning.fetch(location, kind, None), ProgressLog(logger.info))
