"""The one-generation-per-model queue: a FIFO turn for the loaded model.

One holder at a time (a generation, a race, a load); the others wait in arrival order and can
see their position. A waiter whose cancel event is set leaves the queue without ever running.

    with queue.turn(request_id, cancel) as got_it:
        if got_it:
            ...  # the model is ours until the block ends
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

CANCEL_POLL_S = 0.05  # how often a waiter checks its cancel event (events cannot notify a lock)


@dataclass(eq=False, slots=True)
class _Ticket:
    request_id: str
    cancel: threading.Event | None


class GenerationQueue:
    """FIFO turn-taking for one model; position 0 is the holder, 1.. the waiters in order."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._waiting: deque[_Ticket] = deque()
        self._holder: _Ticket | None = None

    @property
    def busy(self) -> bool:
        with self._cond:
            return self._holder is not None

    @property
    def queued(self) -> int:
        with self._cond:
            return len(self._waiting)

    def position(self, request_id: str) -> int | None:
        """0 while running, n while n-th in line, None when unknown or finished."""
        with self._cond:
            if self._holder is not None and self._holder.request_id == request_id:
                return 0
            for index, ticket in enumerate(self._waiting, start=1):
                if ticket.request_id == request_id:
                    return index
            return None

    @contextmanager
    def turn(self, request_id: str, cancel: threading.Event | None = None) -> Iterator[bool]:
        """Hold the model inside the block; yields False if ``cancel`` was set while waiting.

        Used inside generators: the turn is released when the generator finishes or is closed.
        """
        ticket = _Ticket(request_id, cancel)
        got = self._wait(ticket)
        try:
            yield got
        finally:
            if got:
                with self._cond:
                    self._holder = None
                    self._cond.notify_all()

    def _wait(self, ticket: _Ticket) -> bool:
        with self._cond:
            self._waiting.append(ticket)
            try:
                while self._holder is not None or self._waiting[0] is not ticket:
                    if ticket.cancel is not None and ticket.cancel.is_set():
                        return False
                    self._cond.wait(timeout=CANCEL_POLL_S)
                self._holder = ticket
                return True
            finally:
                if ticket in self._waiting:  # identity (eq=False): leave the line either way
                    self._waiting.remove(ticket)
                self._cond.notify_all()
