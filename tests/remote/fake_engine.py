"""A loopback stand-in for an OpenAI-compatible engine: /v1/models, streamed
/v1/chat/completions and a Prometheus /metrics whose speculation counters grow with every
reply, so the client's per-reply deltas can be checked against known numbers.

``speculation=False`` serves metrics without speculation counters (a server started without a
draft model); ``metrics=False`` answers /metrics with 404.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# Per reply: 3 draft rounds of 4 tokens; 7 accepted (3 at position 0, 2 at 1, 1 at 2, 1 at 3).
DRAFTS, DRAFT_TOKENS, ACCEPTED, PER_POSITION = 3, 12, 7, (3, 2, 1, 1)
PIECES = ("Hello", " from", " the", " remote", " engine.")


@dataclass
class FakeEngine:
    speculation: bool = True
    metrics: bool = True
    vllm: bool = True
    replies: int = 0
    requests: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    engine._send(self, 200, json.dumps({"data": [{"id": "fake-model"}]}))
                elif self.path == "/metrics" and engine.metrics:
                    engine._send(self, 200, engine.metrics_text(), "text/plain")
                else:
                    engine._send(self, 404, "{}")

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                engine.requests.append(body)
                engine.stream_reply(self, body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, code: int, text: str, kind: str = "") -> None:
        data = text.encode()
        handler.send_response(code)
        handler.send_header("Content-Type", kind or "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def metrics_text(self) -> str:
        lines = ["# HELP vllm:num_requests_running running", "vllm:num_requests_running 0"]
        if self.speculation:
            n = self.replies
            label = 'engine="0",model_name="fake-model"'
            lines += [
                f"vllm:spec_decode_num_drafts_total{{{label}}} {DRAFTS * n}.0",
                f"vllm:spec_decode_num_draft_tokens_total{{{label}}} {DRAFT_TOKENS * n}.0",
                f"vllm:spec_decode_num_accepted_tokens_total{{{label}}} {ACCEPTED * n}.0",
                f"vllm:spec_decode_num_drafts_created{{{label}}} 1.7e9",
            ]
            lines += [
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{label},position="{p}"}} '
                f"{count * n}.0"
                for p, count in enumerate(PER_POSITION)
            ]
        return "\n".join(lines) + "\n"

    def stream_reply(self, handler: BaseHTTPRequestHandler, body: dict) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.end_headers()
        pieces = PIECES[: body.get("max_tokens", len(PIECES))]
        for index, piece in enumerate(pieces):
            choice: dict = {"index": 0, "delta": {"content": piece}, "finish_reason": None}
            if body.get("return_token_ids"):
                choice["token_ids"] = [100 + index]
            if index == len(pieces) - 1:
                choice["finish_reason"] = "stop" if len(pieces) == len(PIECES) else "length"
            handler.wfile.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
            handler.wfile.flush()
        self.replies += 1  # counted before [DONE]: the client reads /metrics right after it
        usage = {"choices": [], "usage": {"completion_tokens": len(pieces)}}
        handler.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
