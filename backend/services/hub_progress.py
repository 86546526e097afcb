"""Byte and file progress for Hub downloads, as ``backend.events.Progress`` events.

huggingface_hub reports bytes only through a tqdm-like class it instantiates per file (on both
its HTTP and Xet paths); :func:`bar_class` builds such a class bound to a :class:`DownloadMeter`,
which sums the files of a whole plan, throttles events and checks for cancellation.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from backend.errors import GenerationCancelled
from backend.events import Progress

logger = logging.getLogger(__name__)

ProgressCallback = Callable[[Progress], None]
PROGRESS_INTERVAL_S = 0.2  # at most this often a byte event, plus one at each file boundary


@dataclass(frozen=True, slots=True)
class DownloadSize:
    """A whole plan's bytes and files, and how much of it is on disk before the download."""

    total_bytes: int
    num_files: int
    done_bytes: int = 0
    done_files: int = 0


class DownloadMeter:
    """Whole-plan progress: ``unit="bytes"`` events (monotonic, files already on disk count as
    done from the start) and ``unit="files"`` events at the start and after each file."""

    def __init__(
        self,
        callback: ProgressCallback,
        size: DownloadSize,
        cancel: threading.Event | None = None,
        label: str = "",
    ) -> None:
        self._callback = callback
        self._cancel = cancel
        self._lock = threading.Lock()  # Xet reports from its own threads
        self._total = size.total_bytes
        self._num_files = size.num_files
        self._files_done = size.done_files
        self._finished_bytes = size.done_bytes
        self._in_file = 0.0
        self._sent = 0.0
        self._sent_at = 0.0
        self._label = label
        self._emit(force=True)
        self._callback(Progress("download", size.done_files, size.num_files, "files", label))

    def check_cancel(self) -> None:
        if self._cancel is not None and self._cancel.is_set():
            raise GenerationCancelled(
                "download cancelled", hint="run it again to continue; finished files are kept"
            )

    def start_file(self, filename: str) -> None:
        self.check_cancel()
        self._label = filename
        self._emit(force=True)

    def add(self, num_bytes: float) -> None:
        """Bytes written for the current file; raising here aborts huggingface_hub's transfer."""
        with self._lock:
            self._in_file += num_bytes
        self.check_cancel()
        self._emit(force=False)

    def finish_file(self, filename: str, size: int) -> None:
        with self._lock:
            self._finished_bytes += size
            self._in_file = 0.0
            self._files_done += 1
        self._emit(force=True)
        self._callback(Progress("download", self._files_done, self._num_files, "files", filename))

    def _emit(self, force: bool) -> None:
        with self._lock:
            # max(): a server that ignores a resume Range restarts the file's count at 0.
            done = max(min(self._finished_bytes + self._in_file, self._total), self._sent)
            now = time.monotonic()
            if not force and (done == self._sent or now - self._sent_at < PROGRESS_INTERVAL_S):
                return
            self._sent, self._sent_at = done, now
            message = f"{self._label} ({self._files_done}/{self._num_files} files)"
            event = Progress("download", done, self._total, "bytes", message)
        self._callback(event)


def bar_class(meter: DownloadMeter) -> type:
    """A tqdm stand-in class bound to ``meter``, for ``hf_hub_download(tqdm_class=...)``."""

    class _MeterBar:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.total = kwargs.get("total")
            self.n = 0.0
            self.update(kwargs.get("initial") or 0)

        def update(self, n: float | None = 1) -> None:
            if n:
                self.n += n
                meter.add(n)

        def update_transfer(self, n: float | None = 1) -> None:
            """Network bytes (Xet): counted by ``update`` already; defining this makes
            huggingface_hub route them here instead of opening a second bar."""

        def _ignore(self, *args: Any, **kwargs: Any) -> None:
            """Display-only calls (descriptions, postfixes, refresh, close)."""

        set_postfix_str = set_transfer_postfix_str = _ignore
        set_description = set_description_str = refresh = clear = close = _ignore

        def __enter__(self) -> _MeterBar:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    return _MeterBar
