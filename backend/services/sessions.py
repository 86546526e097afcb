"""Chat sessions and the one-generation-per-model queue.

- :class:`GenerationQueue`: a FIFO turn for the loaded model. One holder at a time (a
  generation, a race, a load); the others wait in arrival order and can see their position.
  A waiter whose cancel event is set leaves the queue without ever running.
- :class:`ChatSession`: one conversation's history, system prompt and settings. Each reply goes
  through the tokenizer's chat template with the whole history (``Backend.stream``); ``stop()``
  ends the running reply and leaves the session ready for the next message.

    session = ChatSession(backend, system_prompt="Be brief.")
    for event in session.send("Hello"):
        ...
    session.stop()  # from another thread: the reply ends with stop_reason "cancelled"
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from backend.config import GenerationConfig
from backend.events import Finished, GenerationEvent, GenerationFailed
from backend.services.prompting import Message

if TYPE_CHECKING:
    from backend.api import Backend

logger = logging.getLogger(__name__)

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


class ChatSession:
    """One conversation: history, system prompt and settings, generating through a Backend.

    The session holds the backend, not a model, so after ``backend.load(...)`` of another pair
    the next reply comes from the new model with the same history (re-tokenised by its
    template). A finished reply is added to the history; a cancelled one too when it produced
    text, so the conversation reads as the user saw it; a failed one leaves no trace.
    """

    def __init__(
        self,
        backend: Backend,
        system_prompt: str | None = None,
        config: GenerationConfig | None = None,
        raw: bool = False,
    ) -> None:
        self.backend = backend
        self.system_prompt = system_prompt
        self.config = config or GenerationConfig()
        self.raw = raw  # skip the chat template (base models without one)
        self.history: list[Message] = []
        self._cancel: threading.Event | None = None

    def send(self, text: str, config: GenerationConfig | None = None) -> Iterator[GenerationEvent]:
        """Stream the reply to ``text``; the history is updated when the stream ends."""
        cancel = threading.Event()
        self._cancel = cancel
        if not text.strip():
            yield GenerationFailed("", "input", "the message is empty", "type a message first")
            return
        user: Message = {"role": "user", "content": text}
        messages = [*self.history, user]
        for event in self.backend.stream(
            messages, config or self.config, self.system_prompt, raw=self.raw, cancel=cancel
        ):
            if isinstance(event, Finished):
                summary = event.summary
                if summary.stop_reason != "cancelled" or summary.text:
                    self.history += [user, {"role": "assistant", "content": summary.text}]
            yield event

    def stop(self) -> None:
        """End the running reply (safe from any thread; a no-op when nothing runs)."""
        if self._cancel is not None:
            self._cancel.set()

    def clear(self) -> None:
        self.history = []

    def set_sampling(self, **changes: object) -> None:
        """Change sampling settings (temperature, top_p, top_k, seed) for the next replies."""
        sampling = dataclasses.replace(self.config.sampling, **changes)
        self.config = dataclasses.replace(self.config, sampling=sampling)

    @property
    def messages(self) -> list[Message]:
        """The conversation as the template sees it, system prompt first."""
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*system, *(dict(m) for m in self.history)]
