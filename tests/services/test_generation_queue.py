"""The model queue and conversations through Backend.stream: a stopped reply leaves the backend
usable, concurrent requests run one at a time in arrival order, the history goes through the
chat template, models switch live under a running conversation."""

from __future__ import annotations

import dataclasses
import gc
import threading
import time
import weakref

import pytest

from backend.api import Backend
from backend.config import LoadConfig
from backend.events import Finished, GenerationEvent, Loaded, RoundCompleted, Started
from tests.services.conftest import SavedPairs, greedy


@pytest.fixture()
def backend(saved_pairs: SavedPairs) -> Backend:
    backend = Backend()
    events = list(backend.load(LoadConfig(str(saved_pairs.target), str(saved_pairs.head))))
    assert isinstance(events[-1], Loaded), events[-1]
    return backend


def finished(events: list[GenerationEvent]) -> Finished:
    assert isinstance(events[-1], Finished), events[-1]
    return events[-1]


def wait_until(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def turn(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


def reference(backend: Backend, messages, max_new_tokens: int) -> tuple[int, ...]:
    """Vanilla decoding of the same conversation: what a correct reply must be."""
    events = list(backend.stream(messages, greedy(max_new_tokens, "vanilla")))
    return finished(events).summary.token_ids


def test_stop_mid_stream_then_the_next_reply_is_complete_and_correct(backend: Backend) -> None:
    cancel = threading.Event()
    rounds = 0
    events = []
    first = [turn("user", "hello world")]
    for event in backend.stream(first, greedy(30), "Be brief.", cancel=cancel):
        events.append(event)
        if isinstance(event, RoundCompleted):
            rounds += 1
            if rounds == 3:
                cancel.set()
    summary = finished(events).summary
    assert summary.stop_reason == "cancelled"
    assert 0 < summary.new_tokens < 30
    assert backend.status().busy is False

    history = [*first, turn("assistant", summary.text), turn("user", "the quick brown fox")]
    second = finished(list(backend.stream(history, greedy(30), "Be brief."))).summary
    assert second.stop_reason == "max_new_tokens"
    assert second.new_tokens == 30
    assert second.token_ids == reference(backend, [turn("system", "Be brief."), *history], 30)


def test_stop_from_another_thread(backend: Backend) -> None:
    cancel, started = threading.Event(), threading.Event()

    def stopper() -> None:
        started.wait(5)
        cancel.set()

    thread = threading.Thread(target=stopper)
    thread.start()
    events = []
    for event in backend.stream([turn("user", "hello world")], greedy(400), cancel=cancel):
        events.append(event)
        if isinstance(event, RoundCompleted):
            started.set()
    thread.join()
    assert finished(events).summary.stop_reason == "cancelled"
    again = finished(list(backend.stream([turn("user", "again")], greedy(400)))).summary
    assert again.stop_reason in ("max_new_tokens", "eos")


def test_concurrent_requests_run_one_at_a_time_in_arrival_order(backend: Backend) -> None:
    pair = backend.pair
    assert pair is not None
    model = pair.engine.runner.model
    original_forward = model.forward
    active, peak, lock = [0], [0], threading.Lock()

    def counting_forward(*args, **kwargs):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        try:
            time.sleep(0.001)  # widen the window an overlap would need
            return original_forward(*args, **kwargs)
        finally:
            with lock:
                active[0] -= 1

    model.forward = counting_forward
    log: list[tuple[str, str]] = []  # (request, event type) in the order they happened
    first_started, release_first = threading.Event(), threading.Event()
    messages = [{"role": "user", "content": "hello world"}]

    def consume(request_id: str) -> None:
        for event in backend.stream(messages, greedy(12), request_id=request_id):
            with lock:
                log.append((request_id, type(event).__name__))
            if request_id == "a" and isinstance(event, Started):
                first_started.set()
                release_first.wait(10)  # hold the model until the others are queued

    threads = {rid: threading.Thread(target=consume, args=(rid,)) for rid in "abc"}
    threads["a"].start()
    assert first_started.wait(10)
    for rid in "bc":
        threads[rid].start()
        wait_until(lambda rid=rid: backend.queue_position(rid) is not None)
    assert backend.queue_position("a") == 0
    assert (backend.queue_position("b"), backend.queue_position("c")) == (1, 2)
    assert backend.status().busy and backend.status().queued == 2
    release_first.set()
    for thread in threads.values():
        thread.join(30)
    model.forward = original_forward

    assert peak[0] == 1  # the model never ran two forwards at once
    order = [rid for rid, _ in log]
    assert order == sorted(order)  # a's events, then all of b's, then all of c's
    assert [kind for rid, kind in log if kind == "Finished"] == ["Finished"] * 3
    assert backend.status().queued == 0 and not backend.status().busy


def test_a_request_cancelled_while_queued_never_runs(backend: Backend) -> None:
    messages = [{"role": "user", "content": "hello world"}]
    holder = backend.stream(messages, greedy(8), request_id="holder")
    assert isinstance(next(holder), Started)  # holds the model
    cancel = threading.Event()
    result: list[GenerationEvent] = []
    waiter = threading.Thread(
        target=lambda: result.extend(
            backend.stream(messages, greedy(8), cancel=cancel, request_id="w")
        )
    )
    waiter.start()
    wait_until(lambda: backend.queue_position("w") == 1)
    cancel.set()
    waiter.join(10)
    assert finished(result).summary.stop_reason == "cancelled"
    assert finished(result).summary.new_tokens == 0
    assert backend.status().queued == 0
    assert finished(list(holder)).summary.new_tokens == 8


def test_history_goes_through_the_chat_template(backend: Backend, monkeypatch) -> None:
    pair = backend.pair
    assert pair is not None
    seen: list[list[dict[str, str]]] = []
    template = pair.tokenizer.apply_chat_template

    def spy(messages, *args, **kwargs):
        seen.append([dict(m) for m in messages])
        return template(messages, *args, **kwargs)

    monkeypatch.setattr(pair.tokenizer, "apply_chat_template", spy)
    history = [turn("user", "hello"), turn("assistant", "hi there"), turn("user", "world")]
    events = list(backend.stream(history, greedy(6), "You are terse."))
    expected = [turn("system", "You are terse."), *history]
    assert seen[-1] == expected
    text = template(expected, add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|user|>world<|end|><|assistant|>")
    prompt_tokens = len(pair.tokenizer(text, add_special_tokens=False)["input_ids"])
    assert isinstance(events[0], Started) and events[0].prompt_tokens == prompt_tokens
    assert finished(events).summary.new_tokens == 6


def test_switching_models_keeps_the_conversation_and_frees_the_old_model(
    backend: Backend, saved_pairs: SavedPairs
) -> None:
    history = [turn("user", "hello")]
    first = finished(list(backend.stream(history, greedy(8, "vanilla")))).summary
    assert backend.pair is not None
    old_model = weakref.ref(backend.pair.model)

    events = list(backend.load(LoadConfig(str(saved_pairs.other_target))))
    assert isinstance(events[-1], Loaded), events[-1]
    gc.collect()
    assert old_model() is None  # the first pair's weights are gone
    assert backend.status().loaded.target == str(saved_pairs.other_target)

    history += [turn("assistant", first.text), turn("user", "world")]
    reply = finished(list(backend.stream(history, greedy(8, "vanilla")))).summary
    assert reply.token_ids == reference(backend, history, 8)  # from the new model


def test_head_drafts_without_a_head_are_a_clear_error(
    backend: Backend, saved_pairs: SavedPairs
) -> None:
    list(backend.load(LoadConfig(str(saved_pairs.other_target))))
    head_only = dataclasses.replace(greedy(8, "eagle"), drafts="head")
    events = list(backend.stream([turn("user", "hello")], head_only))
    assert type(events[-1]).__name__ == "GenerationFailed"
    assert "needs a draft head" in events[-1].message
    events = list(backend.stream([turn("user", "hello")], greedy(8, "eagle")))
    assert type(events[-1]).__name__ == "Finished"  # context drafts alone
