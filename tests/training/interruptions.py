"""Stopping a training stage part way, as Ctrl-C would, for the resume tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from models.training.trainer import TrainProgress


def fails_on_call(function: Callable[..., Any], call: int) -> Callable[..., Any]:
    """``function``, except that its ``call``-th call raises KeyboardInterrupt instead."""
    calls = 0

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == call:
            raise KeyboardInterrupt
        return function(*args, **kwargs)

    return wrapped


def stops_at_step(step: int) -> Callable[[TrainProgress], None]:
    """A train_head progress callback that raises KeyboardInterrupt when ``step`` is reached."""

    def callback(progress: TrainProgress) -> None:
        if progress.step == step:
            raise KeyboardInterrupt

    return callback
