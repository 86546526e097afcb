"""Per-browser-session state kept in one ``gr.State``: stop switches, the measured baseline and
the original text of the replies shown (the chat shows them as escaped Markdown).

Gradio deep-copies a State's initial value for every new session; :meth:`Session.__deepcopy__`
returns a fresh object because a ``threading.Event`` cannot be copied. The object itself is
shared by every event of that session, which is what lets a Stop click reach the generation
that is running in another worker thread.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Literal

from backend.events import PairInfo

Job = Literal["chat", "race", "download", "baseline"]

# Every event that uses the model joins one Gradio concurrency group. Its limit is above 1 on
# purpose: the backend already runs one job at a time in arrival order (its own FIFO queue),
# and a request that waits *there* has started, so its Stop switch exists and works while it
# waits. Gradio's limit only bounds the worker threads parked in that queue.
MODEL_GROUP = "model"
MODEL_CONCURRENCY = 8
MAX_REMEMBERED_REPLIES = 256  # per session; a longer chat falls back to the shown text


@dataclass
class Baseline:
    """Vanilla tokens/s measured on one loaded pair (stale once another pair is loaded)."""

    info: PairInfo
    tokens_per_s: float


@dataclass
class Run:
    """One run of a job: its stop switch, and whether its output is still wanted."""

    cancel: threading.Event = field(default_factory=threading.Event)
    discarded: bool = False  # Clear was pressed: the run must not write into the cleared view


@dataclass
class Session:
    runs: dict[str, Run] = field(default_factory=dict)
    baseline: Baseline | None = None
    replies: dict[str, str] = field(default_factory=dict)  # shown Markdown -> model's text

    def __deepcopy__(self, memo: dict[int, Any]) -> Session:
        return Session()

    def start(self, job: Job) -> Run:
        """A fresh run of ``job`` (a late Stop of the previous run must not cancel this one)."""
        run = Run()
        self.runs[job] = run
        return run

    def stop(self, job: Job, discard: bool = False) -> bool:
        """Flip the stop switch of the running ``job``; False when nothing was running.
        ``discard`` also tells the run to drop its remaining output."""
        run = self.runs.get(job)
        if run is None:
            return False
        run.discarded = run.discarded or discard
        if run.cancel.is_set():
            return False
        run.cancel.set()
        return True

    def remember_reply(self, shown: str, original: str) -> None:
        """Remember what the model wrote behind a reply shown as ``shown``, so the next turn
        sends the model its own words, not their display form."""
        self.replies.pop(shown, None)
        self.replies[shown] = original
        while len(self.replies) > MAX_REMEMBERED_REPLIES:
            del self.replies[next(iter(self.replies))]

    def baseline_for(self, info: PairInfo | None) -> float | None:
        if self.baseline is not None and info is not None and self.baseline.info == info:
            return self.baseline.tokens_per_s
        return None
