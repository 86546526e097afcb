"""llama.cpp as a bench peer (``bench --peer llama.cpp``): plain greedy decoding of the target's
own GGUF file, on the same prompt tokens, thread count and token budget as our rows, interleaved
with them prompt by prompt.

llama.cpp runs through ``llama-cpp-python`` in a side venv (its sdist compiles llama.cpp for this
CPU: ``bash scripts/side-venvs.sh llama-cpp``, about 20 minutes), in a worker process that loads
the model once and answers one request per prompt (llama_cpp_worker.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from backend.bench.runner import MethodRun
from backend.config import GenerationConfig
from backend.errors import ConfigError
from backend.services.target_source import is_gguf_path

NAME = "llama.cpp"
VENV = "llama-cpp"
ROOT = Path(__file__).resolve().parents[3]
WORKER = Path(__file__).with_name("llama_cpp_worker.py")
CONTEXT = 4096  # tokens of context the worker allocates: any bench prompt plus its reply


def side_venvs() -> Path:
    return Path(os.environ.get("EAGLECHAT_SIDE_VENVS", ROOT / ".cache" / "side-venvs"))


def side_python() -> Path | None:
    """The llama-cpp side venv's python, or None when it was never built (or not finished)."""
    venv = side_venvs() / VENV
    python = venv / "bin" / "python"
    return python if python.is_file() and (venv / ".pins").is_file() else None


class LlamaCppPeer:
    """One llama.cpp worker serving the bench's prompts for ``gguf_path``."""

    def __init__(self, gguf_path: str, threads: int, eos_ids: tuple[int, ...]) -> None:
        if not is_gguf_path(gguf_path):
            raise ConfigError(
                f"--peer llama.cpp runs the target's GGUF file, but the target is {gguf_path}",
                hint="name a .gguf target (--target FILE.gguf, or a GGUF pair such as gemma3-270m)",
            )
        python = side_python()
        if python is None:
            raise ConfigError(
                f"the llama-cpp side venv is missing in {side_venvs()}",
                hint="build it once: bash scripts/side-venvs.sh llama-cpp (about 20 minutes)",
            )
        self.eos_ids = eos_ids
        self._process = subprocess.Popen(
            [str(python), str(WORKER), gguf_path, str(threads), str(CONTEXT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        if self._read().get("ready") is not True:
            raise ConfigError("the llama.cpp worker did not start", hint="see its output above")

    def run(self, ids: list[int], config: GenerationConfig) -> MethodRun:
        """Greedy llama.cpp decoding of ``ids``: as ``bench`` runs ours (EOS ends it)."""
        if not config.sampling.greedy:
            raise ConfigError("--peer llama.cpp compares greedy decoding only (--temperature 0)")
        request = {"ids": ids, "max_new_tokens": config.max_new_tokens, "eos_ids": self.eos_ids}
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        answer = self._read()
        return MethodRun(
            NAME,
            tuple(answer["tokens"]),
            answer["seconds"],
            ttft_s=answer["ttft_s"],
            rounds=0,
            acceptance_lengths=(),
        )

    def _read(self) -> dict:
        line = self._process.stdout.readline()
        if not line:
            raise ConfigError(f"the llama.cpp worker ended (exit code {self._process.poll()})")
        return json.loads(line)

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.stdin.close()
            self._process.wait(timeout=30)
