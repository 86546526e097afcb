"""Generators that yield progress and return a result (``result = yield from steps``): run one
to its end, or pass its progress on in another form. Shared by the engine and the services."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TypeVar

P = TypeVar("P")
Q = TypeVar("Q")
T = TypeVar("T")


def relay(steps: Generator[P, None, T], convert: Callable[[P], Q]) -> Generator[Q, None, T]:
    """Re-yield every progress item of ``steps`` as ``convert(item)``; return its result."""
    while True:
        try:
            item = next(steps)
        except StopIteration as finished:
            return finished.value
        yield convert(item)


def drain(steps: Generator[P, None, T], on_progress: Callable[[P], None] | None = None) -> T:
    """Run ``steps`` to its end and return its result (blocking callers), reporting progress to
    ``on_progress`` if given."""
    relayed = relay(steps, on_progress or (lambda item: None))
    while True:
        try:
            next(relayed)
        except StopIteration as finished:
            return finished.value
