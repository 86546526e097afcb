"""``launch.py serve``: the vLLM and SGLang commands built from a pair, checked against the
engines' documented flags (the real vLLM build checks its own --help in
tests/remote/test_vllm_remote.py), the install check, start/wait/stop on a stub server, and
the commands in README.md and docs/, which must be exactly what --dry-run prints."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

import launch
from backend.config import TreeConfig
from backend.errors import ConfigError, EagleChatError
from backend.services.engine_server import EngineServer, ServeSpec, check_installed, server_command
from tests.app.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
# Flags as the engines document them: vLLM's `vllm serve --help` / api_server arguments and
# SGLang's server arguments page (sglang.srt.server_args).
VLLM_FLAGS = {
    "--model",
    "--dtype",
    "--max-model-len",
    "--tensor-parallel-size",
    "--host",
    "--port",
    "--gpu-memory-utilization",
    "--speculative-config",
    "--distributed-executor-backend",
}
VLLM_SPECULATIVE_KEYS = {"method", "model", "num_speculative_tokens", "draft_tensor_parallel_size"}
SGLANG_FLAGS = {
    "--model-path",
    "--dtype",
    "--context-length",
    "--tp-size",
    "--nnodes",
    "--node-rank",
    "--dist-init-addr",
    "--speculative-algorithm",
    "--speculative-draft-model-path",
    "--speculative-num-steps",
    "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
    "--host",
    "--port",
}
TREE = TreeConfig(total_tokens=16, depth=5, top_k=4)


def spec(engine: str = "vllm", **overrides) -> ServeSpec:
    values = dict(
        engine=engine, target="org/target", head="org/head", head_kind="eagle3", tree=TREE
    )
    return ServeSpec(**{**values, **overrides})


def options(argv: list[str]) -> dict[str, str]:
    """--flag value pairs of a command (every flag the builder writes takes a value)."""
    flags = [i for i, arg in enumerate(argv) if arg.startswith("--")]
    return {argv[i]: argv[i + 1] for i in flags}


def test_vllm_command_uses_documented_flags_and_the_heads_settings() -> None:
    argv, env = server_command(spec(tensor_parallel_size=4, draft_tensor_parallel_size=1))
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"] and env == {}
    flags = options(argv)
    assert set(flags) <= VLLM_FLAGS
    assert flags["--model"] == "org/target" and flags["--tensor-parallel-size"] == "4"
    speculative = json.loads(flags["--speculative-config"])
    assert set(speculative) <= VLLM_SPECULATIVE_KEYS
    assert speculative == {
        "method": "eagle3",
        "model": "org/head",
        "num_speculative_tokens": 5,
        "draft_tensor_parallel_size": 1,
    }
    eagle1 = json.loads(
        options(server_command(spec(head_kind="eagle1"))[0])["--speculative-config"]
    )
    assert eagle1["method"] == "eagle"
    argv, env = server_command(spec(cpu=True, nnodes=2))
    assert env == {"VLLM_CPU_KVCACHE_SPACE": "1"}
    assert options(argv)["--gpu-memory-utilization"] == "0.3"
    assert options(argv)["--distributed-executor-backend"] == "ray"
    assert "--tensor-parallel-size" not in options(server_command(spec())[0])


def test_sglang_command_uses_documented_flags_and_the_tree() -> None:
    argv, env = server_command(spec("sglang", tensor_parallel_size=8, head_kind="eagle1"))
    flags = options(argv)
    assert argv[1:3] == ["-m", "sglang.launch_server"] and env == {}
    assert set(flags) <= SGLANG_FLAGS
    assert flags["--speculative-algorithm"] == "EAGLE" and flags["--tp-size"] == "8"
    assert (
        flags["--speculative-num-steps"],
        flags["--speculative-eagle-topk"],
        flags["--speculative-num-draft-tokens"],
    ) == ("5", "4", "16")
    assert flags["--speculative-draft-model-path"] == "org/head" and flags["--port"] == "30000"
    multi = options(
        server_command(spec("sglang", nnodes=2, node_rank=1, dist_init_addr="10.0.0.1:20000"))[0]
    )
    assert (multi["--nnodes"], multi["--node-rank"], multi["--dist-init-addr"]) == (
        "2",
        "1",
        "10.0.0.1:20000",
    )
    assert options(server_command(spec("sglang"))[0])["--speculative-algorithm"] == "EAGLE3"


def test_bad_combinations_are_refused_with_a_hint() -> None:
    with pytest.raises(ConfigError, match="dist-init-addr") as err:
        spec("sglang", nnodes=2)
    assert "--node-rank" in err.value.hint
    with pytest.raises(ConfigError, match="CPU build"):
        spec("sglang", cpu=True)


def test_engine_not_installed_is_an_error_with_an_install_hint(capsys) -> None:
    with pytest.raises(EagleChatError, match="sglang is not installed") as err:
        check_installed(spec("sglang", python=sys.executable))
    assert err.value.code == "engine_missing" and "pip install sglang" in err.value.hint
    code = launch.main(["serve", "--engine", "vllm", "--pair", "demo", "--python", sys.executable])
    out = capsys.readouterr().err
    assert code == 2 and "error: vllm is not installed" in out and "hint: pip install vllm" in out
    assert "Traceback" not in out


def test_server_start_wait_and_stop_on_a_stub(tmp_path: Path) -> None:
    """A stand-in 'python' that serves /health (a file) proves start, readiness and stop."""
    (tmp_path / "health").write_text("ok")
    stub = tmp_path / "python"
    port = free_port()
    stub.write_text(  # ignores the engine's arguments, serves the folder with /health in it
        f"#!/bin/sh\ncd {tmp_path} && exec {sys.executable} -m http.server {port} --bind 127.0.0.1\n"
    )
    stub.chmod(0o755)
    server = EngineServer(spec(python=str(stub), port=port), tmp_path / "log")
    try:
        server.wait_ready(timeout_s=60)
        assert server.url == f"http://127.0.0.1:{port}"
    finally:
        server.stop()
    assert server.process.poll() is not None
    stub.write_text("#!/bin/sh\necho 'no such model' >&2\nexit 1\n")
    failing = EngineServer(spec(python=str(stub), port=free_port()), tmp_path / "log2")
    with pytest.raises(EagleChatError, match="exited during startup") as err:
        failing.wait_ready(timeout_s=60)
    failing.stop()
    assert "no such model" in err.value.hint


def documented_commands() -> str:
    """README.md and docs/*.md with backslash-continued lines joined, as a shell reads them."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return "\n".join(re.sub(r" *\\\n *", " ", page.read_text()) for page in pages)


@pytest.mark.parametrize(
    "args",
    [
        ["--engine", "vllm", "--pair", "demo", "--cpu", "--max-model-len", "1024"],
        ["--engine", "sglang", "--pair", "demo"],
        ["--engine", "vllm", "--pair", "llama3.1-8b-eagle3", "--tensor-parallel-size", "4"],
        ["--engine", "sglang", "--pair", "llama3.1-8b-eagle3", "--tensor-parallel-size", "4"],
        [
            "--engine",
            "vllm",
            "--target",
            "./my-model",
            "--head",
            "heads/mine",
            "--head-kind",
            "eagle3",
            "--depth",
            "4",
        ],
        [
            "--engine",
            "vllm",
            "--pair",
            "llama3.3-70b-eagle3",
            "--tensor-parallel-size",
            "16",
            "--nnodes",
            "2",
            "--host",
            "0.0.0.0",
        ],
        [
            "--engine",
            "sglang",
            "--pair",
            "llama3.3-70b-eagle3",
            "--tensor-parallel-size",
            "16",
            "--nnodes",
            "2",
            "--node-rank",
            "0",
            "--dist-init-addr",
            "10.0.0.1:20000",
            "--host",
            "0.0.0.0",
        ],
    ],
)
def test_documented_commands_are_the_dry_run_output(args, capsys, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    assert launch.main(["serve", *args, "--python", "python", "--dry-run"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed in documented_commands(), f"the docs lack: {printed}"
    assert f"python launch.py serve {' '.join(args)}" in documented_commands()
