"""Online unless asked or unreachable: scripts/run.sh no longer forces HF_HUB_OFFLINE, the app
probes the Hub once (loopback stand-ins here, never the real Hub) and goes offline by itself
when it cannot be reached, and the bundled demo pair starts with no network at all."""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub import constants

from app import main as app_main
from backend.events import Loaded
from backend.services import hub_mode

ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = ("127.0.0.1", "localhost", "::1")


@pytest.fixture
def online_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """A session that did not ask for offline mode (the test session itself sets it)."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """No route anywhere but loopback: lookups and connections elsewhere fail at once."""
    attempts: list[Any] = []
    real_getaddrinfo, real_connect = socket.getaddrinfo, socket.socket.connect

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host not in LOOPBACK:
            attempts.append(host)
            raise socket.gaierror(socket.EAI_NONAME, "no network in this test")
        return real_getaddrinfo(host, *args, **kwargs)

    def connect(sock: socket.socket, address: Any) -> Any:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in LOOPBACK:
            attempts.append(address)
            raise OSError("no network in this test")
        return real_connect(sock, address)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", connect)
    return attempts


def run_script_with_stubs(tmp_path: Path, args: list[str], env: dict[str, str]) -> str:
    """scripts/run.sh as shipped, with setup.sh and the venv's python replaced by stubs that
    print what the app would get."""
    (tmp_path / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "run.sh", tmp_path / "scripts" / "run.sh")
    (tmp_path / "scripts" / "setup.sh").write_text("#!/usr/bin/env bash\n")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text('#!/usr/bin/env bash\necho "HF_HUB_OFFLINE=${HF_HUB_OFFLINE-unset} $*"\n')
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    base = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE",)}
    done = subprocess.run(
        ["bash", str(tmp_path / "scripts" / "run.sh"), *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


def test_run_sh_stays_online_unless_asked(tmp_path: Path) -> None:
    assert run_script_with_stubs(tmp_path / "a", [], {}) == "HF_HUB_OFFLINE=unset launch.py"
    assert run_script_with_stubs(tmp_path / "b", ["--offline"], {}).endswith("launch.py --offline")
    asked = run_script_with_stubs(tmp_path / "c", [], {"HF_HUB_OFFLINE": "1"})
    assert asked.startswith("HF_HUB_OFFLINE=1 ")


def test_the_app_takes_an_offline_flag() -> None:
    parser = argparse.ArgumentParser()
    app_main.add_arguments(parser)
    assert parser.parse_args(["--offline"]).offline and not parser.parse_args([]).offline


def test_asked_offline_goes_offline_without_probing(online_env: None, no_network) -> None:
    reason = hub_mode.choose_hub_mode(asked_offline=True)
    assert reason is not None and "--offline" in reason
    assert os.environ["HF_HUB_OFFLINE"] == "1" and constants.HF_HUB_OFFLINE is True
    assert no_network == []  # nothing was probed


def test_a_reachable_hub_keeps_downloads_on(
    online_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:  # stands in for the Hub
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        assert hub_mode.choose_hub_mode() is None
    assert "HF_HUB_OFFLINE" not in os.environ and constants.HF_HUB_OFFLINE is False


def test_an_unreachable_hub_switches_to_offline(
    online_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")  # nothing listens there now
    reason = hub_mode.choose_hub_mode(timeout_s=2.0)
    assert reason is not None and "could not be reached" in reason and str(port) in reason
    assert os.environ["HF_HUB_OFFLINE"] == "1" and constants.HF_HUB_OFFLINE is True


def test_demo_pair_starts_with_no_network(online_env: None, no_network: list[Any]) -> None:
    if not (ROOT / "assets" / "demo" / "head-eagle3" / "config.json").is_file():
        pytest.skip("demo pair not built (python launch.py make-demo)")
    parser = argparse.ArgumentParser()
    app_main.add_arguments(parser)
    backend, config, selected, notice = app_main.prepare(parser.parse_args([]))
    assert selected == app_main.DEMO_PAIR and config is not None
    info = backend.status().loaded
    assert info is not None and info.target == config.target
    assert "Hub offline mode" in notice and "could not be reached" in notice
    assert "Could not load" not in notice
    assert no_network, "the probe should have tried the Hub (and failed)"
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    # Loading again works the same way while offline.
    assert isinstance(list(backend.load(config))[-1], Loaded)
