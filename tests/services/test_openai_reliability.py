"""Load and soak of the OpenAI-compatible endpoint, on loopback with bounded loops.

- 200 consecutive chats (after 20 to warm up) through ``launch.py serve-api --pair demo``:
  the server process's resident memory grows by less than 5%;
- 8 concurrent clients on the demo pair: all provably queued behind one another, none lost,
  each reply equal to what its prompt gives alone at T=0;
- a client that disconnects (streaming, non-streaming, or while still queued) frees the model:
  its generation stops instead of running to max_tokens, and the next request is served.

``python -m pytest -m soak -s tests/services/test_openai_reliability.py`` prints the figures
quoted in docs/reliability.md.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from backend.api import Backend
from backend.config import LoadConfig
from backend.events import Finished, Loaded, RoundCompleted, Started
from backend.frontends.openai_server import ServerHandle, start_openai_server
from models.checkpoints import save_head
from tests.factories import easy_llama_pair, tiny_tokenizer
from tests.services.test_openai_api import post

pytestmark = pytest.mark.soak

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "assets" / "demo"
PROMPTS = [
    "Hello! Who are you?",
    "Tom has 12 apples. He gives 5 to his friend. How many apples does he have now?",
    "Write a Python function that returns the sum of a list of numbers.",
    "What do you like to do on weekends?",
    "Tell me a short story about a fox.",
    "What is the capital of France?",
    "How do I make a cup of tea?",
    "Give me three words that rhyme with cat.",
]
LONG = 4000  # max_tokens of a reply that, left alone, runs this long (EOS ignored below)
WAIT_S = 60.0  # upper bound on waiting for the server's state; never reached when it works


@dataclass
class Run:
    """What one request did on the model, as the Backend saw it."""

    prompt: str
    started: threading.Event = dataclasses.field(default_factory=threading.Event)
    tokens: int = 0
    stop_reason: str | None = None  # None: the stream was closed before it finished
    ended: threading.Event = dataclasses.field(default_factory=threading.Event)


class ObservedBackend(Backend):
    """A Backend that records each request's tokens and end, can hold the model inside a
    reply until ``gate`` is set (so that later clients are provably queued), and can ignore
    EOS (so that a reply left alone runs to max_tokens). The server code is unchanged."""

    def __init__(self, ignore_eos: bool = False) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.ignore_eos = ignore_eos
        self.runs: dict[str, Run] = {}

    def stream(self, messages, config, *args, **kwargs) -> Iterator:
        if self.ignore_eos:
            config = dataclasses.replace(config, stop_on_eos=False)
        run = self.runs[messages[-1]["content"]] = Run(messages[-1]["content"])
        events = super().stream(messages, config, *args, **kwargs)
        try:
            for event in events:
                if isinstance(event, RoundCompleted):
                    run.tokens += len(event.token_ids)
                elif isinstance(event, Finished):
                    run.stop_reason = event.summary.stop_reason
                yield event
                if isinstance(event, Started) and event.prompt_tokens > 0:  # holds the model
                    run.started.set()
                    self.gate.wait(WAIT_S)
        finally:
            events.close()
            run.ended.set()


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


def chat(url: str, prompt: str, max_tokens: int, stream: bool, **extra) -> str:
    """One chat turn; the reply's text, checked for a complete OpenAI-shaped response."""
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
        **extra,
    }
    if not stream:
        status, payload = post(url, body)
        assert status == 200, payload
        assert payload["choices"][0]["finish_reason"] in ("stop", "length")
        return payload["choices"][0]["message"]["content"]
    connection = open_stream(url, body)
    response = connection.getresponse()
    assert response.status == 200
    lines = [line for line in response.read().decode().split("\n") if line]
    connection.close()
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    return "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)


def open_stream(url: str, body: dict) -> http.client.HTTPConnection:
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=WAIT_S)
    headers = {"Content-Type": "application/json"}
    connection.request("POST", "/v1/chat/completions", body=json.dumps(body), headers=headers)
    return connection


def serve(backend: Backend, config: LoadConfig) -> ServerHandle:
    events = list(backend.load(config))
    assert isinstance(events[-1], Loaded), events[-1]
    return start_openai_server(backend, "127.0.0.1", 0)


# ---- 8 concurrent clients on the demo pair -------------------------------------------------


@pytest.fixture(scope="module")
def demo() -> Iterator[tuple[ObservedBackend, ServerHandle]]:
    backend = ObservedBackend()
    target, head = DEMO / "target", DEMO / "head-eagle3"
    server = serve(backend, LoadConfig(target=str(target), head=str(head), dtype="float32"))
    yield backend, server
    server.close()


def test_eight_concurrent_clients_are_queued_and_each_reply_is_intact(demo) -> None:
    backend, server = demo
    alone = {prompt: chat(server.url, prompt, 24, stream=False) for prompt in PROMPTS}
    assert all(alone.values()) and len(set(alone.values())) > 1

    results: dict[str, str] = {}
    errors: list[BaseException] = []

    def client(index: int, prompt: str) -> None:
        try:
            results[prompt] = chat(server.url, prompt, 24, stream=index % 2 == 1)
        except BaseException as err:  # reported by the main thread
            errors.append(err)

    backend.gate.clear()  # the first client to get the model keeps it until all are queued
    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=pair) for pair in enumerate(PROMPTS)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: backend.status().queued == len(PROMPTS) - 1, "7 clients are queued")
    finally:
        backend.gate.set()
    for thread in threads:
        thread.join(WAIT_S)
    elapsed = time.perf_counter() - start
    assert not errors, errors
    assert results == alone  # none lost, each reply the one its prompt gives alone
    # the last reply reaches its client a moment before its handler gives the model back
    wait_for(lambda: backend.status().queued == 0 and not backend.status().busy, "all are done")
    print(
        f"\n[soak] 8 concurrent clients: 7 queued at once, 8/8 served, replies identical to "
        f"alone, {elapsed:.2f} s for all"
    )


# ---- disconnects -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def long_replies(tmp_path_factory) -> Iterator[tuple[ObservedBackend, ServerHandle]]:
    """A tiny pair whose replies run to max_tokens (EOS ignored, context above LONG)."""
    base = tmp_path_factory.mktemp("long-pair")
    tokenizer = tiny_tokenizer(base / "target")
    target, head = easy_llama_pair(vocab_size=len(tokenizer), num_layers=4)
    target.config.max_position_embeddings = 2 * LONG
    target.save_pretrained(base / "target")
    save_head(head, base / "head")
    backend = ObservedBackend(ignore_eos=True)
    server = serve(backend, LoadConfig(target=str(base / "target"), head=str(base / "head")))
    yield backend, server
    server.close()


VANILLA = {"eaglechat": {"mode": "vanilla"}}  # one token per round: the longest generation


def assert_freed(backend: ObservedBackend, url: str, abandoned: str) -> None:
    """The abandoned reply stopped early and the next request is served."""
    start = time.perf_counter()
    assert chat(url, "next client", 4, stream=False, **VANILLA)
    elapsed = time.perf_counter() - start
    run = backend.runs[abandoned]
    assert run.ended.is_set()  # the next request ran, so the abandoned one had let go
    assert run.tokens < LONG and run.stop_reason in (None, "cancelled"), run
    print(
        f"\n[soak] {abandoned!r}: stopped after {run.tokens} of {LONG} tokens, next request "
        f"answered {elapsed:.2f} s after the disconnect"
    )


def test_a_streaming_client_that_disconnects_frees_the_model(long_replies) -> None:
    backend, server = long_replies
    body = {
        "messages": [{"role": "user", "content": "stream then leave"}],
        "max_tokens": LONG,
        "stream": True,
        **VANILLA,
    }
    connection = open_stream(server.url, body)
    response = connection.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: ")  # the stream is under way
    response.close()
    connection.close()
    assert_freed(backend, server.url, "stream then leave")


def test_a_waiting_non_streaming_client_that_disconnects_frees_the_model(long_replies) -> None:
    backend, server = long_replies
    body = {
        "messages": [{"role": "user", "content": "wait then leave"}],
        "max_tokens": LONG,
        **VANILLA,
    }
    connection = open_stream(server.url, body)
    wait_for(lambda: "wait then leave" in backend.runs, "the request reached the backend")
    run = backend.runs["wait then leave"]
    wait_for(lambda: run.tokens > 0, "its generation is under way")
    connection.close()  # nothing was written to it yet: only the watcher can notice
    assert_freed(backend, server.url, "wait then leave")
    assert run.stop_reason == "cancelled"


def test_a_queued_client_that_disconnects_leaves_the_queue(long_replies) -> None:
    backend, server = long_replies
    backend.gate.clear()
    holder = threading.Thread(target=chat, args=(server.url, "holder", 4, False), kwargs=VANILLA)
    holder.start()
    try:
        wait_for(
            lambda: "holder" in backend.runs and backend.runs["holder"].started.is_set(),
            "the first client holds the model",
        )
        body = {
            "messages": [{"role": "user", "content": "queue then leave"}],
            "max_tokens": LONG,
            **VANILLA,
        }
        connection = open_stream(server.url, body)
        wait_for(lambda: backend.status().queued == 1, "the second client is queued")
        connection.close()
        wait_for(lambda: backend.status().queued == 0, "the second client left the queue")
        assert backend.runs["holder"].started.is_set() and not backend.runs["holder"].ended.is_set()
    finally:
        backend.gate.set()
    holder.join(WAIT_S)
    run = backend.runs["queue then leave"]
    # it left the queue without ever running on the model (its stream closed unanswered)
    assert run.ended.is_set() and not run.started.is_set() and run.tokens == 0


# ---- 200 consecutive chats through serve-api -------------------------------------------------


def resident_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS line")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_two_hundred_chats_keep_the_server_memory_flat() -> None:
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    command = [sys.executable, "launch.py", "serve-api", "--pair", "demo", "--port", "0"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        line = process.stdout.readline()  # type: ignore[union-attr]
        assert "OpenAI-compatible API at http://127.0.0.1:" in line, line
        url = line.split(" at ")[1].split("/v1")[0]

        def chats(count: int, offset: int) -> None:
            for i in range(offset, offset + count):  # greedy and sampled, streamed and not
                sampled = {"temperature": 1.0, "seed": i} if i % 3 == 0 else {}
                reply = chat(url, PROMPTS[i % len(PROMPTS)], 8, stream=i % 2 == 1, **sampled)
                assert isinstance(reply, str)

        chats(20, 0)  # warm-up: calibration, first allocations
        before = resident_kib(process.pid)
        start = time.perf_counter()
        chats(200, 20)
        elapsed = time.perf_counter() - start
        after = resident_kib(process.pid)
    finally:
        process.terminate()
        process.wait(10)
    growth = (after - before) / before
    print(
        f"\n[soak] 200 chats after 20 warm-up: RSS {before / 1024:.1f} -> {after / 1024:.1f} MiB "
        f"({100 * growth:+.2f}%), {elapsed:.1f} s ({1000 * elapsed / 200:.0f} ms per chat)"
    )
    assert growth < 0.05
