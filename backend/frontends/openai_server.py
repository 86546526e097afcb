"""An optional OpenAI-compatible HTTP endpoint served by the app's own process.

    python launch.py serve-api --target PATH --head PATH --port 8000
    curl http://127.0.0.1:8000/v1/chat/completions -d '{"messages": [{"role": "user", "content": "Hi"}]}'

Routes: ``GET /v1/models``, ``POST /v1/chat/completions`` (``stream: true`` gives SSE
``data: {...}`` chunks and ``data: [DONE]``). Responses carry the acceptance statistics in an
``eaglechat`` object (tau, acceptance_lengths, tokens_per_s, rounds...); in streaming, each chunk
carries its round's accepted-draft count and the final chunk the statistics and usage.

Standard library only (``ThreadingHTTPServer``): requests share the Backend's FIFO queue, so
they run one at a time on the model. A client that closes its connection, while queued or while
its reply is generated (streamed or not), cancels its request: it leaves the queue or its
generation stops at the next round, and the model goes to the next client. Off by default;
binds 127.0.0.1 unless a host is given.
``stop`` is one string or a list of up to 4, as in OpenAI's API: the reply ends right before
the first of them (and before the pair's own turn markers), exactly, even inside a round of
accepted drafts, and a stream never shows part of one.
Differences from OpenAI: ``temperature`` defaults to greedy (EagleChat's default), ``n`` must
be 1, and the ``model`` field is not checked (the loaded pair answers whatever name a client
sends).
"""

from __future__ import annotations

import argparse
import json
import logging
import selectors
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backend.config import (
    GenerationConfig,
    SamplingConfig,
    TreeConfig,
)
from backend.errors import EagleChatError, InputError
from backend.events import (
    Finished,
    GenerationEvent,
    GenerationFailed,
    GenerationSummary,
    PairInfo,
    RoundCompleted,
)
from backend.frontends.flags import add_loading_flags, add_model_flags
from backend.frontends.generate_cli import load_config_from

if TYPE_CHECKING:
    from backend.api import Backend

logger = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
MAX_BODY_BYTES = 4 * 1024 * 1024
_STATUS = {"input": 400, "config": 400, "incompatible_head": 400, "no_model": 404}
_TREE_KEYS = {"total_tokens", "depth", "top_k", "shape"}
_FINISH = {"max_new_tokens": "length", "context_length": "length"}  # anything else: "stop"
MAX_STOP_STRINGS = 4  # as many as OpenAI's API takes
DISCONNECT_POLL_S = 0.05  # how often a request's watcher looks whether its client is still there


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Clients beyond the default backlog of 5 would have their connection attempts dropped
    # and retried seconds later; queueing is the Backend's job, so accept them all at once.
    request_queue_size = 64


@dataclass
class ServerHandle:
    """A running server: ``url`` is its base (``http://host:port``); ``close()`` stops it."""

    url: str
    server: ThreadingHTTPServer
    thread: threading.Thread

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def start_openai_server(
    backend: Backend, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT
) -> ServerHandle:
    """Serve ``backend`` in a background thread (port 0 picks a free port)."""
    if host not in ("127.0.0.1", "localhost", "::1"):
        logger.warning(
            "the OpenAI API listens on %s: anyone who can reach it can use the model", host
        )
    server = _Server((host, port), _Handler)
    server.backend = backend  # type: ignore[attr-defined]
    thread = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": 0.1},
        name="eaglechat-openai",
        daemon=True,
    )
    thread.start()
    url = f"http://{host}:{server.server_address[1]}"
    logger.info("OpenAI-compatible API at %s/v1", url)
    return ServerHandle(url=url, server=server, thread=thread)


# ---- request -> configs, events -> OpenAI JSON ---------------------------------------------


def parse_request(
    body: dict[str, Any], info: PairInfo
) -> tuple[list[dict[str, str]], GenerationConfig]:
    """Messages and generation settings of a chat request; InputError/ConfigError when bad."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InputError("'messages' must be a non-empty list", code="input")
    parsed = [_message(m, i) for i, m in enumerate(messages)]
    if body.get("n", 1) != 1:
        raise InputError("only n=1 is supported")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise InputError("'seed' must be an integer")
    defaults = SamplingConfig()
    settings: dict[str, Any] = {
        "sampling": SamplingConfig(
            temperature=float(_number(body, "temperature", defaults.temperature)),
            top_p=float(_number(body, "top_p", defaults.top_p)),
            top_k=int(_number(body, "top_k", defaults.top_k)),
            seed=seed,
        ),
        "stop": _stop_strings(body.get("stop")),
    }
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None:
        settings["max_new_tokens"] = max_tokens
    extra = body.get("eaglechat") or {}
    if not isinstance(extra, dict):
        raise InputError("'eaglechat' must be an object")
    settings["mode"] = extra.get("mode", "eagle" if info.head else "vanilla")
    if isinstance(extra.get("tree"), dict):  # otherwise GenerationConfig's default tree
        unknown = sorted(set(extra["tree"]) - _TREE_KEYS)
        if unknown:
            raise InputError(
                f"unknown eaglechat.tree keys {unknown}", hint=f"allowed: {sorted(_TREE_KEYS)}"
            )
        settings["tree"] = TreeConfig(**extra["tree"])
    config = GenerationConfig(**settings)
    return parsed, config


def stats(summary: GenerationSummary, mode: str) -> dict[str, Any]:
    """The acceptance statistics attached to every response (definitions in events.py)."""
    return {
        "mode": mode,
        "tau": summary.tau,
        "acceptance_lengths": list(summary.acceptance_lengths),
        "accept_per_depth": list(summary.accept_per_depth),
        "rounds": summary.rounds,
        "new_tokens": summary.new_tokens,
        "tokens_per_s": summary.tokens_per_s,
        "ttft_s": summary.ttft_s,
        "total_s": summary.total_s,
        "stop_reason": summary.stop_reason,
        "stopped_by": summary.stopped_by,
    }


def model_id(info: PairInfo) -> str:
    """A Hub id as is; a local folder by its name."""
    is_repo = info.target.count("/") == 1 and not Path(info.target).is_dir()
    return info.target if is_repo else Path(info.target).name


def _message(raw: Any, index: int) -> dict[str, str]:
    if not isinstance(raw, dict) or raw.get("role") not in ("system", "user", "assistant"):
        raise InputError(f"messages[{index}] needs a role of system, user or assistant")
    content = raw.get("content")
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        parts = [
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        ]
        content = "".join(parts)
    if not isinstance(content, str):
        raise InputError(f"messages[{index}].content must be a string or text parts")
    return {"role": raw["role"], "content": content}


def _stop_strings(value: Any) -> tuple[str, ...]:
    """OpenAI's ``stop``: null, one string, or a list of up to ``MAX_STOP_STRINGS`` strings."""
    if value is None:
        return ()
    strings = [value] if isinstance(value, str) else value
    if (
        not isinstance(strings, list)
        or len(strings) > MAX_STOP_STRINGS
        or not all(isinstance(s, str) for s in strings)
    ):
        raise InputError(f"'stop' must be a string or a list of up to {MAX_STOP_STRINGS} strings")
    if not all(strings):
        raise InputError("'stop' strings must not be empty")
    return tuple(strings)


def _number(body: dict[str, Any], key: str, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"'{key}' must be a number")
    return value


def _usage(summary: GenerationSummary, prompt_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": summary.new_tokens,
        "total_tokens": prompt_tokens + summary.new_tokens,
    }


@contextmanager
def cancel_on_disconnect(connection: socket.socket) -> Iterator[threading.Event]:
    """An event that is set as soon as the client closes ``connection`` (checked by a watcher
    thread, so a client waiting in the queue is noticed too), and when the block ends."""
    cancel, done = threading.Event(), threading.Event()

    def watch() -> None:
        with selectors.DefaultSelector() as selector:  # no descriptor limit, unlike select()
            selector.register(connection, selectors.EVENT_READ)
            while not done.wait(DISCONNECT_POLL_S):
                if selector.select(timeout=0) and _peer_closed(connection):
                    logger.info("client went away; cancelling its request")
                    cancel.set()
                    return

    watcher = threading.Thread(target=watch, name="eaglechat-openai-watch", daemon=True)
    watcher.start()
    try:
        yield cancel
    finally:
        cancel.set()
        done.set()
        watcher.join()


def _peer_closed(connection: socket.socket) -> bool:
    """On a readable connection: True when the peer closed or reset it. Only peeks: bytes a
    client sends early (a pipelined next request) stay for the handler to read."""
    try:
        return connection.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:  # reset by the peer
        return True


def _error_body(code: str, message: str, hint: str = "") -> dict[str, Any]:
    kind = "invalid_request_error" if _status(code) < 500 else "server_error"
    text = f"{message} ({hint})" if hint else message
    return {"error": {"message": text, "type": kind, "code": code}}


def _status(code: str) -> int:
    return _STATUS.get(code, 500)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "EagleChat"

    @property
    def backend(self) -> Backend:
        return self.server.backend  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib signature)
        logger.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:  # noqa: N802 (stdlib name)
        if self.path.rstrip("/") != "/v1/models":
            self._json(404, _error_body("not_found", f"no route {self.path}"))
            return
        info = self.backend.status().loaded
        data = (
            []
            if info is None
            else [{"id": model_id(info), "object": "model", "created": 0, "owned_by": "eaglechat"}]
        )
        self._json(200, {"object": "list", "data": data})

    def do_POST(self) -> None:  # noqa: N802 (stdlib name)
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._json(404, _error_body("not_found", f"no route {self.path}"))
            return
        try:
            body = self._read_json()
            info = self.backend.status().loaded
            if info is None:
                raise EagleChatError(
                    "no model is loaded", hint="load a pair first", code="no_model"
                )
            messages, config = parse_request(body, info)
        except EagleChatError as err:
            self._json(_status(err.code), _error_body(err.code, err.message, err.hint))
            return
        except (TypeError, ValueError) as err:  # a field of the wrong JSON type
            self._json(400, _error_body("input", f"invalid request: {err}"))
            return
        with cancel_on_disconnect(self.connection) as cancel:
            events = self.backend.stream(messages, config, cancel=cancel)
            try:
                first = next(events)
                if cancel.is_set():  # the client left while queued: nobody to answer
                    self.close_connection = True
                elif isinstance(first, GenerationFailed):
                    self._json(
                        _status(first.code), _error_body(first.code, first.message, first.hint)
                    )
                elif body.get("stream"):
                    self._stream(first, events, info, config.mode)
                else:
                    self._complete(first, events, info, config.mode)
            except ConnectionError:  # reset or broken pipe while writing the reply
                logger.info("client went away; cancelling its generation")
                self.close_connection = True
            finally:
                cancel.set()
                events.close()  # releases the model's queue turn at once

    def _complete(
        self, first: GenerationEvent, events: Iterator[GenerationEvent], info: PairInfo, mode: str
    ) -> None:
        prompt_tokens = getattr(first, "prompt_tokens", 0)
        for event in events:
            if isinstance(event, GenerationFailed):
                self._json(_status(event.code), _error_body(event.code, event.message, event.hint))
                return
            if isinstance(event, Finished):
                summary = event.summary
                self._json(
                    200,
                    {
                        "id": f"chatcmpl-{event.request_id}",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": model_id(info),
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": summary.text},
                                "finish_reason": _FINISH.get(summary.stop_reason, "stop"),
                            }
                        ],
                        "usage": _usage(summary, prompt_tokens),
                        "eaglechat": stats(summary, mode),
                    },
                )
                return
        self._json(500, _error_body("internal", "the generation ended without a result"))

    def _stream(
        self, first: GenerationEvent, events: Iterator[GenerationEvent], info: PairInfo, mode: str
    ) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        prompt_tokens = getattr(first, "prompt_tokens", 0)
        base = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model_id(info),
        }

        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> None:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            self._sse({**base, "choices": [choice], **extra})

        chunk({"role": "assistant", "content": ""})
        streamed = ""
        for event in events:
            if isinstance(event, RoundCompleted):
                text = "".join(span.text for span in event.spans)
                streamed += text
                round_stats = {
                    "round": event.round_index,
                    "accepted_drafts": event.num_accepted_drafts,
                    "tokens": len(event.token_ids),
                }
                chunk({"content": text}, eaglechat=round_stats)
            elif isinstance(event, Finished):
                summary = event.summary
                # bytes the detokenizer held back (an unfinished character) end the reply
                rest = summary.text[len(streamed) :] if summary.text.startswith(streamed) else ""
                chunk(
                    {"content": rest} if rest else {},
                    _FINISH.get(summary.stop_reason, "stop"),
                    usage=_usage(summary, prompt_tokens),
                    eaglechat=stats(summary, mode),
                )
            elif isinstance(event, GenerationFailed):
                self._sse(_error_body(event.code, event.message, event.hint))
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _sse(self, payload: dict[str, Any]) -> None:
        self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
        self.wfile.flush()

    def _read_json(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        if length <= 0 or length > MAX_BODY_BYTES:
            raise InputError(f"the request body must be JSON of 1 to {MAX_BODY_BYTES} bytes")
        try:
            body = json.loads(self.rfile.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise InputError(f"the request body is not valid JSON: {err}") from err
        if not isinstance(body, dict):
            raise InputError("the request body must be a JSON object")
        return body

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


# ---- CLI glue ------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_flags(parser)
    parser.add_argument(
        "--host", default=DEFAULT_HOST, help="interface to bind (default: loopback only)"
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    add_loading_flags(parser)


def run(args: argparse.Namespace) -> int:
    from backend.api import Backend

    backend = Backend()
    backend.load_blocking(load_config_from(args))
    handle = start_openai_server(backend, args.host, args.port)
    print(f"OpenAI-compatible API at {handle.url}/v1 (Ctrl-C to stop)", flush=True)
    try:
        threading.Event().wait()
    finally:
        handle.close()
    return 0
