"""The OpenAI-compatible endpoint over plain HTTP on loopback: non-streaming and SSE streaming
replies in OpenAI's shape with EagleChat's acceptance statistics, and JSON errors with 4xx."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backend.api import Backend
from backend.config import LoadConfig
from backend.events import Finished, Loaded
from backend.frontends.openai_server import ServerHandle, start_openai_server
from tests.services.conftest import SavedPairs, greedy

ROOT = Path(__file__).resolve().parents[2]
REQUEST = {
    "model": "anything",
    "messages": [{"role": "user", "content": "hello world"}],
    "max_tokens": 12,
    "temperature": 0,
    "eaglechat": {"tree": {"total_tokens": 8, "depth": 4, "top_k": 2}},
}


@pytest.fixture(scope="module")
def loaded(saved_pairs: SavedPairs) -> Iterator[tuple[Backend, ServerHandle]]:
    backend = Backend()
    events = list(backend.load(LoadConfig(str(saved_pairs.target), str(saved_pairs.head))))
    assert isinstance(events[-1], Loaded), events[-1]
    server = start_openai_server(backend, "127.0.0.1", 0)
    yield backend, server
    server.close()


@pytest.fixture()
def empty_server() -> Iterator[ServerHandle]:
    server = start_openai_server(Backend(), "127.0.0.1", 0)
    yield server
    server.close()


def post(url: str, body: Any, raw: bytes | None = None) -> tuple[int, dict[str, Any]]:
    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{url}/v1/chat/completions", data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        assert err.headers["Content-Type"] == "application/json"
        return err.code, json.loads(err.read())


def test_non_streaming_completion_carries_the_statistics(loaded) -> None:
    backend, server = loaded
    status, body = post(server.url, REQUEST)
    assert status == 200, body
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["model"] == "target"
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] in ("stop", "length")
    stats = body["eaglechat"]
    assert stats["mode"] == "eagle"
    assert len(stats["acceptance_lengths"]) == stats["rounds"] > 0
    assert stats["tau"] > 1.0 and stats["tokens_per_s"] > 0
    assert body["usage"]["completion_tokens"] == stats["new_tokens"] <= 12
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + stats["new_tokens"]

    direct = list(backend.stream(REQUEST["messages"], greedy(12)))  # same reply without HTTP
    assert isinstance(direct[-1], Finished)
    assert choice["message"]["content"] == direct[-1].summary.text


def test_streaming_completion_sends_sse_chunks_then_done(loaded) -> None:
    _, server = loaded
    host, port = server.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.request(
        "POST",
        "/v1/chat/completions",
        body=json.dumps({**REQUEST, "stream": True}),
        headers={"Content-Type": "application/json"},
    )
    response = connection.getresponse()
    assert response.status == 200
    assert response.getheader("Content-Type") == "text/event-stream"
    lines = [line for line in response.read().decode().split("\n") if line]
    connection.close()
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"

    rounds = [c for c in chunks[1:-1]]
    assert rounds and all("accepted_drafts" in c["eaglechat"] for c in rounds)
    final = chunks[-1]
    assert final["choices"][0]["finish_reason"] in ("stop", "length")
    stats = final["eaglechat"]
    # round 0 is the prefill's token; the statistics count the verification rounds after it
    assert [c["eaglechat"]["tokens"] for c in rounds[1:]] == stats["acceptance_lengths"]
    assert sum(c["eaglechat"]["tokens"] for c in rounds) == stats["new_tokens"]
    assert final["usage"]["completion_tokens"] == stats["new_tokens"]

    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    _, body = post(server.url, REQUEST)
    assert text == body["choices"][0]["message"]["content"]  # same reply both ways


def test_vanilla_mode_and_models_list(loaded) -> None:
    _, server = loaded
    status, body = post(server.url, {**REQUEST, "eaglechat": {"mode": "vanilla"}})
    assert status == 200 and body["eaglechat"]["mode"] == "vanilla"
    assert body["eaglechat"]["tau"] == 1.0
    with urllib.request.urlopen(f"{server.url}/v1/models", timeout=10) as response:
        models = json.loads(response.read())
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["target"]


@pytest.mark.parametrize(
    "body, raw, message",
    [
        ({**REQUEST, "messages": []}, None, "'messages' must be a non-empty list"),
        (
            {**REQUEST, "messages": [{"role": "user", "content": "   "}]},
            None,
            "the prompt is empty",
        ),
        ({**REQUEST, "messages": [{"role": "robot", "content": "hi"}]}, None, "needs a role"),
        ({**REQUEST, "max_tokens": 0}, None, "max_new_tokens must be a positive"),
        ({**REQUEST, "temperature": "hot"}, None, "'temperature' must be a number"),
        ({**REQUEST, "eaglechat": {"tree": {"depth": 0}}}, None, "tree depth must be >= 1"),
        (None, b"{not json", "not valid JSON"),
    ],
)
def test_bad_requests_get_a_json_400(loaded, body, raw, message) -> None:
    _, server = loaded
    status, payload = post(server.url, body, raw)
    assert status == 400
    assert message in payload["error"]["message"]
    assert payload["error"]["type"] == "invalid_request_error"


def test_no_model_loaded_is_a_json_404(empty_server: ServerHandle) -> None:
    status, payload = post(empty_server.url, REQUEST)
    assert status == 404
    assert payload["error"]["code"] == "no_model"
    assert "no model is loaded" in payload["error"]["message"]
    with urllib.request.urlopen(f"{empty_server.url}/v1/models", timeout=10) as response:
        assert json.loads(response.read())["data"] == []


def test_unknown_route_is_a_json_404(empty_server: ServerHandle) -> None:
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"{empty_server.url}/v2/nothing", timeout=10)
    assert info.value.code == 404
    assert json.loads(info.value.read())["error"]["code"] == "not_found"


def test_binds_loopback_by_default(empty_server: ServerHandle) -> None:
    assert empty_server.url.startswith("http://127.0.0.1:")
    assert empty_server.server.server_address[0] == "127.0.0.1"


def test_serve_api_cli_glue(saved_pairs: SavedPairs) -> None:
    """``serve-api`` loads the pair, prints its URL and answers on loopback until stopped."""
    script = (
        "import argparse, sys; from backend.frontends import openai_server as m; "
        "p = argparse.ArgumentParser(); m.add_arguments(p); sys.exit(m.run(p.parse_args()))"
    )
    args = ["--target", str(saved_pairs.target), "--head", str(saved_pairs.head), "--port", "0"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    process = subprocess.Popen(
        [sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT
    )
    try:
        line = process.stdout.readline()  # type: ignore[union-attr]
        assert "OpenAI-compatible API at http://127.0.0.1:" in line, line
        url = line.split(" at ")[1].split("/v1")[0]
        status, body = post(url, REQUEST)
        assert status == 200 and body["eaglechat"]["mode"] == "eagle"
    finally:
        process.terminate()
        process.wait(10)
