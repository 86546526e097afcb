"""``python launch.py download``: fetch a catalog pair or a target (and head) into the HF cache.

    python launch.py download llama3.1-8b-eagle3 --dry-run
    python launch.py download Qwen/Qwen3-1.7B --head AngelSlim/Qwen3-1.7B_eagle3 --token hf_...

Prints the plan (files, sizes, what is cached), a text progress bar on stderr, then the local
paths a loader can open. Known failures print ``error:`` and ``hint:`` lines and exit with 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import TextIO

from backend.errors import ConfigError, EagleChatError
from backend.events import Progress, format_bytes
from backend.services.catalog import PairSpec, find_pair, load_catalog
from backend.services.hub import (
    DownloadPlan,
    RepoKind,
    check_disk_space,
    download,
    plan_download,
)

logger = logging.getLogger(__name__)

EXIT_ERROR = 2
EXIT_INTERRUPTED = 130


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "pair_or_id",
        metavar="PAIR_OR_ID",
        help="a catalog pair name (e.g. llama3.1-8b-eagle3) or a target Hub repo id",
    )
    parser.add_argument("--head", default=None, help="head Hub repo id (overrides the pair's)")
    parser.add_argument(
        "--dry-run", action="store_true", help="show what would be downloaded, then stop"
    )
    parser.add_argument(
        "--token", default=None, help="Hugging Face token (default: HF_TOKEN or the saved login)"
    )


def run(args: argparse.Namespace) -> int:
    """Plan, check disk space, download; one-line errors with a hint and exit code 2."""
    try:
        return _run(args)
    except EagleChatError as err:
        _print_error(err.message, err.hint)
        return EXIT_ERROR
    except KeyboardInterrupt:
        _print_error("interrupted", "run the same command again; finished files are kept")
        return EXIT_INTERRUPTED


def _run(args: argparse.Namespace) -> int:
    repos = _repos(args.pair_or_id, args.head)
    if not repos:
        return 0
    plans = [plan_download(repo_id, kind, token=args.token) for kind, repo_id in repos]
    for plan in plans:
        _print_plan(plan)
    if args.dry_run:
        try:
            check_disk_space(*plans)
        except EagleChatError as err:
            print(f"warning: {err.message}")
        return 0
    check_disk_space(*plans)
    paths = []
    for plan in plans:
        bar = _TextBar(plan.repo_id, sys.stderr)
        try:
            paths.append((plan.kind, download(plan, bar, token=args.token)))
        finally:
            bar.close()
    for kind, path in paths:
        print(f"{kind}: {path}")
    return 0


def _repos(pair_or_id: str, head: str | None) -> list[tuple[RepoKind, str]]:
    """(kind, repo id) to fetch; a bundled offline pair needs nothing and is only checked."""
    names = {pair.name for pair in load_catalog()}
    if pair_or_id in names:
        pair = find_pair(pair_or_id)
        if pair.offline:
            _check_bundled(pair)
            return []
        return [("target", pair.target), ("head", head or pair.head)]
    if "/" not in pair_or_id:
        raise ConfigError(
            f"{pair_or_id!r} is neither a catalog pair nor a Hub repo id (org/name)",
            hint=f"known pairs: {', '.join(sorted(names))}",
        )
    repos: list[tuple[RepoKind, str]] = [("target", pair_or_id)]
    if head:
        repos.append(("head", head))
    return repos


def _check_bundled(pair: PairSpec) -> None:
    missing = [path for path in (pair.target, pair.head) if not Path(path).is_dir()]
    if missing:
        raise ConfigError(
            f"the bundled pair {pair.name!r} is missing {', '.join(missing)}",
            hint="run: python launch.py make-demo",
        )
    print(f"{pair.name} is bundled; nothing to download")
    print(f"target: {pair.target}\nhead: {pair.head}")


def _print_plan(plan: DownloadPlan) -> None:
    source = " (from the local cache)" if plan.from_cache else ""
    gated = " [gated]" if plan.gated else ""
    print(f"{plan.kind} {plan.repo_id} @ {plan.commit[:10]}{gated}{source}")
    width = max(len(f.filename) for f in plan.files)
    for planned in plan.files:
        state = "cached" if planned.cached else ""
        print(f"  {planned.filename:<{width}}  {format_bytes(planned.size):>9}  {state}")
    print(
        f"  {len(plan.files)} files, {format_bytes(plan.total_bytes)}; "
        f"{plan.num_cached} cached ({format_bytes(plan.cached_bytes)}), "
        f"{format_bytes(plan.bytes_to_download)} to download"
    )


def _print_error(message: str, hint: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    if hint:
        print(f"hint: {hint}", file=sys.stderr)


class _TextBar:
    """A one-line bar redrawn in place on stderr: bytes, files, speed."""

    WIDTH = 30

    def __init__(self, label: str, stream: TextIO) -> None:
        self._label = label
        self._stream = stream
        self._start = time.monotonic()
        self._first_done: float | None = None  # bytes already cached are not speed
        self._bytes = Progress("download", 0, None, "bytes")
        self._files = ""
        self._drawn = False

    def __call__(self, event: Progress) -> None:
        if event.unit == "files":
            self._files = f"{event.done:.0f}/{event.total:.0f} files"
        else:
            self._bytes = event
            if self._first_done is None:
                self._first_done = event.done
        if not self._stream.isatty() and event.unit != "files":
            return  # logs and pipes get one line per finished file, not a redrawn bar
        done, total = self._bytes.done, self._bytes.total or 0
        percent = int(100 * done / total) if total else 100
        filled = self.WIDTH * percent // 100
        elapsed = max(time.monotonic() - self._start, 1e-3)
        rate = (done - (self._first_done or 0.0)) / elapsed
        line = (
            f"{self._label} [{'#' * filled}{'.' * (self.WIDTH - filled)}] {percent:3d}% "
            f"{format_bytes(done)}/{format_bytes(total)} {self._files} {format_bytes(rate)}/s"
        )
        if self._stream.isatty():
            self._stream.write("\r" + line.ljust(100))
            self._drawn = True
        else:
            self._stream.write(line + "\n")
        self._stream.flush()

    def close(self) -> None:
        if self._drawn:
            self._stream.write("\n")
            self._stream.flush()
