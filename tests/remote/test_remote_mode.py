"""Remote mode against loopback fake engines: the events the UI gets, the panel's numbers from
per-reply /metrics deltas, the race, and every error case as one clear message with the chat
still usable afterwards."""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Iterator

import pytest

from app.chat_tab import ERROR_TITLE, ChatController
from app.main import add_arguments, connect_at_start
from app.models_tab import REMOTE, ModelsController
from app.race_tab import RaceController
from app.render import fold, stats_markdown
from app.session import Session
from backend.api import Backend
from backend.config import GenerationConfig
from backend.events import (
    EngineMetrics,
    Finished,
    GenerationFailed,
    Loaded,
    LoadFailed,
    RaceFinished,
    RoundCompleted,
)
from backend.services import remote
from backend.services.engine_metrics import parse_spec_counters
from tests.app.conftest import free_port
from tests.remote import fake_engine
from tests.remote.fake_engine import FakeEngine

SETTINGS = ("", "eagle", 0.0, 1.0, 64, True, 16, 5, 4)
RACE_SETTINGS = ("", 0.0, 1.0, 64, True, 16, 5, 4)
HELLO = [{"role": "user", "content": "Hi"}]


@pytest.fixture(autouse=True)
def quiet_gradio_warnings():
    with warnings.catch_warnings():  # gr.Warning outside a request falls back to warnings
        warnings.simplefilter("ignore")
        yield


@pytest.fixture
def engine() -> Iterator[FakeEngine]:
    server = FakeEngine()
    yield server
    server.stop()


def connected(url: str, baseline: str | None = None) -> Backend:
    backend = Backend()
    events = list(backend.connect_remote(url, baseline))
    assert isinstance(events[-1], Loaded), events[-1]
    return backend


def test_metrics_parser_sums_label_sets_and_positions() -> None:
    engine = FakeEngine()
    try:
        engine.replies = 2  # two label sets of the same counters, as two engines export them
        counters = parse_spec_counters(engine.metrics_text() + engine.metrics_text())
    finally:
        engine.stop()
    assert counters.present
    assert counters.drafts == 4 * fake_engine.DRAFTS
    assert counters.accepted_tokens == 4 * fake_engine.ACCEPTED
    assert counters.accepted_per_position == {0: 12.0, 1: 8.0, 2: 4.0, 3: 4.0}
    assert not parse_spec_counters("vllm:num_requests_running 0\n").present


def test_stream_gives_chunks_metrics_delta_and_summary(engine: FakeEngine) -> None:
    engine.replies = 5  # counters already high: only this reply's change may count
    backend = connected(engine.url)
    assert backend.status().loaded.remote == engine.url
    events = list(
        backend.stream(HELLO, GenerationConfig(max_new_tokens=64), system_prompt="Be brief.")
    )
    chunks = [e for e in events if isinstance(e, RoundCompleted)]
    metrics = next(e for e in events if isinstance(e, EngineMetrics))
    summary = events[-1].summary
    assert isinstance(events[-1], Finished)
    assert len(chunks) == len(fake_engine.PIECES) and not any(c.rounds_known for c in chunks)
    assert metrics.status == "ok" and metrics.drafts == fake_engine.DRAFTS
    assert metrics.acceptance_rate == pytest.approx(fake_engine.ACCEPTED / fake_engine.DRAFT_TOKENS)
    expected = tuple(count / fake_engine.DRAFTS for count in fake_engine.PER_POSITION)
    assert metrics.accepted_per_position == pytest.approx(expected)
    assert summary.text == "".join(fake_engine.PIECES) and summary.stop_reason == "eos"
    assert summary.tau == pytest.approx(1 + fake_engine.ACCEPTED / fake_engine.DRAFTS)
    assert summary.token_ids == (100, 101, 102, 103, 104)
    sent = engine.requests[-1]
    assert sent["stream"] and sent["max_tokens"] == 64 and sent["return_token_ids"]
    assert sent["messages"][0] == {"role": "system", "content": "Be brief."}
    panel = stats_markdown(fold(events))
    assert "| acceptance rate (engine metrics) | 58% |" in panel
    assert "1: 100% · 2: 67% · 3: 33% · 4: 33%" in panel
    assert "| draft rounds / drafted / accepted | 3 / 12 / 7 |" in panel


def test_chat_and_models_tab_in_remote_mode(engine: FakeEngine) -> None:
    backend = Backend()
    models = ModelsController(backend)
    url, head, *_skipped, help_text = models.select_pair(REMOTE)
    assert url.startswith("http://") and head == "" and "launch.py serve" in help_text
    assert "nothing to download" in models.check_plan(engine.url, "", "auto", "none")
    *_, (_, status, header) = list(models.load(engine.url, "", "auto", "none"))
    assert "Connected" in status and "Remote engine" in header and "fake-model" in header
    updates = list(ChatController(backend, 0.0, 0.0).chat("Hi", [], *SETTINGS, Session()))
    history, _, _, numbers, *_ = updates[-1]
    assert history[-1]["content"] == "".join(fake_engine.PIECES)
    assert "acceptance rate (engine metrics) | 58%" in numbers and "Finished" in numbers


def test_race_against_a_baseline_server(engine: FakeEngine) -> None:
    baseline = FakeEngine(speculation=False)
    try:
        backend = connected(engine.url, baseline.url)
        events = list(backend.race(HELLO, GenerationConfig(max_new_tokens=64)))
        updates = list(RaceController(backend, 0.0, 0.0).race("Hi", *RACE_SETTINGS, Session()))
        plain = list(backend.stream(HELLO, GenerationConfig(mode="vanilla", max_new_tokens=8)))
    finally:
        baseline.stop()
    result = events[-1]
    assert isinstance(plain[-1], Finished) and len(baseline.requests) == 3  # vanilla chats go there
    assert isinstance(result, RaceFinished) and result.identical
    assert result.eagle.tau > 1 and result.vanilla.rounds == 0
    assert len(engine.requests) == 2
    assert "EAGLE speedup" in updates[-1][4]


def test_race_without_any_baseline_says_what_to_do(engine: FakeEngine) -> None:
    events = list(connected(engine.url).race(HELLO, GenerationConfig()))
    assert isinstance(events[-1], GenerationFailed) and events[-1].code == "no_baseline"
    assert "--remote-baseline" in events[-1].hint and "--target" in events[-1].hint


def test_unreachable_server_is_one_clear_message(monkeypatch) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setattr(remote, "importable_here", lambda: ["vllm"])
    events = list(Backend().connect_remote(url))
    assert isinstance(events[-1], LoadFailed) and events[-1].code == "unreachable"
    assert "not reachable" in events[-1].message and "launch.py serve" in events[-1].hint
    monkeypatch.setattr(remote, "importable_here", lambda: [])  # no engine installed here
    hint = list(Backend().connect_remote(url))[-1].hint
    assert "no vLLM or SGLang is installed" in hint and "pip install vllm" in hint
    *_, (_, status, _) = list(ModelsController(Backend()).load(url, "", "auto", "none"))
    assert "not reachable" in status and "Traceback" not in status


def test_server_gone_mid_session_then_back(engine: FakeEngine) -> None:
    backend = connected(engine.url)
    engine.stop()
    chat = ChatController(backend, 0.0, 0.0)
    history, _, _, numbers, *_ = list(chat.chat("Hi", [], *SETTINGS, Session()))[-1]
    assert history[-1]["metadata"]["title"] == ERROR_TITLE and "not reachable" in numbers
    again = FakeEngine()
    try:  # the chat keeps its history and works once a server answers again
        chat.backend = connected(again.url)
        history, *_ = list(chat.chat("Hi again", history, *SETTINGS, Session()))[-1]
    finally:
        again.stop()
    assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant"]
    assert history[-1]["content"] == "".join(fake_engine.PIECES)
    sent = again.requests[-1]["messages"]
    assert [m["content"] for m in sent] == ["Hi", "Hi again"]  # the error note is not sent


@pytest.mark.parametrize(
    ("speculation", "metrics", "status", "shown", "asks_ids"),
    [
        (False, True, "no_speculation", "no speculation metrics", True),
        (True, False, "metrics_missing", "no /metrics endpoint", False),
    ],
)
def test_servers_without_numbers_say_why(speculation, metrics, status, shown, asks_ids) -> None:
    engine = FakeEngine(speculation=speculation, metrics=metrics)
    try:
        backend = connected(engine.url)
        events = list(backend.stream(HELLO, GenerationConfig(max_new_tokens=64)))
        updates = list(ChatController(backend, 0.0, 0.0).chat("Hi", [], *SETTINGS, Session()))
    finally:
        engine.stop()
    metrics_event = next(e for e in events if isinstance(e, EngineMetrics))
    assert metrics_event.status == status
    assert isinstance(events[-1], Finished) and events[-1].summary.text
    history, _, _, numbers, *_ = updates[-1]
    assert shown in numbers and history[-1]["content"] == "".join(fake_engine.PIECES)
    assert ("return_token_ids" in engine.requests[-1]) is asks_ids  # vLLM's extension only


def test_app_remote_flag_connects_at_start_or_says_why(engine: FakeEngine) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    backend = Backend()
    config, selected, notice = connect_at_start(
        backend, parser.parse_args(["--remote", engine.url])
    )
    assert (config.target, selected, notice) == (engine.url, REMOTE, "")
    assert backend.status().loaded.remote == engine.url
    gone = f"http://127.0.0.1:{free_port()}"
    _, _, notice = connect_at_start(Backend(), parser.parse_args(["--remote", gone]))
    assert f"Could not connect to `{gone}`" in notice and "not reachable" in notice
