"""The official ``openai`` Python client against ``serve-api`` on loopback: plain and streamed
replies, usage, errors as the client's typed exceptions, and per-request stop strings (one
string or a list of up to 4) that end the reply exactly, streamed or not."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from backend.api import Backend
from backend.config import LoadConfig
from backend.events import Finished, Loaded
from backend.frontends.openai_server import ServerHandle, start_openai_server
from tests.services.conftest import SavedPairs

MESSAGES = [{"role": "user", "content": "hello world"}]
SETTINGS: dict[str, Any] = {
    "model": "anything",
    "max_tokens": 24,
    "temperature": 0,
    "extra_body": {"eaglechat": {"tree": {"total_tokens": 8, "depth": 4, "top_k": 2}}},
}


@pytest.fixture(scope="module")
def server(saved_pairs: SavedPairs) -> Iterator[ServerHandle]:
    backend = Backend()
    events = list(backend.load(LoadConfig(str(saved_pairs.target), str(saved_pairs.head))))
    assert isinstance(events[-1], Loaded), events[-1]
    handle = start_openai_server(backend, "127.0.0.1", 0)
    yield handle
    handle.close()


def client_of(handle: ServerHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{handle.url}/v1", api_key="unused", max_retries=0, timeout=60)


def complete(handle: ServerHandle, **extra: Any):
    return client_of(handle).chat.completions.create(messages=MESSAGES, **SETTINGS, **extra)


def streamed(handle: ServerHandle, **extra: Any) -> tuple[list[str], Any]:
    """The content of every chunk, and the last chunk (finish reason, usage, statistics)."""
    stream = client_of(handle).chat.completions.create(
        messages=MESSAGES, stream=True, **SETTINGS, **extra
    )
    chunks = list(stream)
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    return pieces, chunks[-1]


@pytest.fixture(scope="module")
def free_reply(server: ServerHandle) -> str:
    """The reply without stop strings, which the stop tests cut."""
    text = complete(server).choices[0].message.content
    assert len(text) >= 8, text
    return text


def stop_inside(text: str, start: int, size: int = 2) -> str:
    """A stop string taken from ``text`` near ``start``: whole characters only."""
    for begin in range(start, len(text) - size):
        candidate = text[begin : begin + size]
        if "\ufffd" not in candidate and candidate.strip():
            return candidate
    pytest.fail(f"no clean stop string in {text!r}")


def test_plain_completion_with_usage_and_statistics(server: ServerHandle) -> None:
    reply = complete(server)
    (choice,) = reply.choices
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    stats = reply.model_extra["eaglechat"]
    assert stats["mode"] == "eagle" and stats["rounds"] == len(stats["acceptance_lengths"]) > 0
    assert reply.usage.completion_tokens == stats["new_tokens"] <= SETTINGS["max_tokens"]
    assert reply.usage.prompt_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    models = client_of(server).models.list()
    assert [m.id for m in models.data] == ["target"]


def test_streamed_reply_equals_the_plain_one_and_ends_with_usage(
    server: ServerHandle, free_reply: str
) -> None:
    pieces, last = streamed(server)
    assert "".join(pieces) == free_reply
    assert last.choices[0].finish_reason in ("stop", "length")
    assert last.usage.completion_tokens == last.model_extra["eaglechat"]["new_tokens"]


@pytest.mark.parametrize("as_list", [False, True])
def test_a_stop_string_ends_the_reply_right_before_it(
    server: ServerHandle, free_reply: str, as_list: bool
) -> None:
    stop = stop_inside(free_reply, len(free_reply) // 2)
    expected = free_reply[: free_reply.find(stop)]
    reply = complete(server, stop=[stop] if as_list else stop)
    (choice,) = reply.choices
    assert choice.message.content == expected
    assert choice.finish_reason == "stop"
    stats = reply.model_extra["eaglechat"]
    assert stats["stop_reason"] == "stop_string" and stats["stopped_by"] == stop
    assert reply.usage.completion_tokens < complete(server).usage.completion_tokens


def test_streamed_stop_never_shows_part_of_the_stop_string(
    server: ServerHandle, free_reply: str
) -> None:
    stop = stop_inside(free_reply, len(free_reply) // 2, size=3)
    pieces, last = streamed(server, stop=stop)
    shown = ""
    for piece in pieces:  # what a client has shown after each chunk
        shown += piece
        assert free_reply.startswith(shown) and stop not in shown
    assert shown == free_reply[: free_reply.find(stop)]
    assert last.choices[0].finish_reason == "stop"


def test_the_earliest_of_several_stop_strings_wins(server: ServerHandle, free_reply: str) -> None:
    late = stop_inside(free_reply, 3 * len(free_reply) // 4)
    early = stop_inside(free_reply, len(free_reply) // 4)
    cut = min(free_reply.find(late), free_reply.find(early))
    reply = complete(server, stop=[late, "never-in-the-reply", early])
    assert reply.choices[0].message.content == free_reply[:cut]


def test_the_engine_applies_request_stops_with_the_pairs_own(saved_pairs: SavedPairs) -> None:
    """Through the facade, without HTTP: GenerationConfig.stop cuts the same reply."""
    from dataclasses import replace

    from tests.services.conftest import greedy

    backend = Backend()
    list(backend.load(LoadConfig(str(saved_pairs.target), str(saved_pairs.head))))
    free = list(backend.stream(MESSAGES, greedy(24)))[-1].summary
    stop = stop_inside(free.text, len(free.text) // 2)
    events = list(backend.stream(MESSAGES, replace(greedy(24), stop=(stop,))))
    assert isinstance(events[-1], Finished)
    assert events[-1].summary.text == free.text[: free.text.find(stop)]
    assert backend.pair.engine.stops.strings == ()  # the pair's own rules are left as they were


@pytest.mark.parametrize(
    "extra, status, message",
    [
        ({"stop": ["a", "b", "c", "d", "e"]}, 400, "a list of up to 4 strings"),
        ({"stop": [""]}, 400, "must not be empty"),
        ({"extra_body": {"stop": 7}}, 400, "a list of up to 4 strings"),
        ({"max_tokens": 0}, 400, "max_new_tokens must be a positive"),
        ({"n": 2}, 400, "only n=1"),
        ({"temperature": -1}, 400, "temperature must be >= 0"),
    ],
)
def test_bad_requests_raise_the_clients_typed_errors(
    server: ServerHandle, extra: dict[str, Any], status: int, message: str
) -> None:
    settings = {**SETTINGS, **extra}
    with pytest.raises(openai.BadRequestError) as info:
        client_of(server).chat.completions.create(messages=MESSAGES, **settings)
    assert info.value.status_code == status
    assert message in info.value.message
    assert info.value.body["type"] == "invalid_request_error"


def test_no_model_loaded_is_a_not_found_error() -> None:
    handle = start_openai_server(Backend(), "127.0.0.1", 0)
    try:
        with pytest.raises(openai.NotFoundError) as info:
            complete(handle)
        assert info.value.code == "no_model"
    finally:
        handle.close()
