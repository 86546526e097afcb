"""UI handlers as plain functions over a scripted backend: requests built, values streamed."""

from __future__ import annotations

import argparse
import threading
import warnings
from dataclasses import replace

import gradio as gr
import pytest

from app.chat_tab import ERROR_TITLE, ChatController, backend_messages
from app.main import DEMO_MISSING, check_exposure, parse_auth, startup_pair
from app.models_tab import CUSTOM, ModelsController, tree_config
from app.race_tab import RaceController
from app.render import ESTIMATE_NOTE, HEAD_LABEL
from app.session import Session
from backend.config import TreeConfig
from backend.errors import ConfigError
from backend.events import GenerationFailed
from tests.app.fakes import FakeBackend, make_info

# system prompt, mode, temperature, top_p, max_new_tokens, tree auto, total, depth, top_k
SETTINGS = ("", "eagle", 0.0, 1.0, 64, True, 16, 5, 4)


def chat_controller(backend: FakeBackend) -> ChatController:
    return ChatController(backend, min_refresh_s=0.0, plot_refresh_s=0.0)


@pytest.fixture(autouse=True)
def quiet_gradio_warnings():
    with warnings.catch_warnings():  # gr.Warning outside a request falls back to warnings
        warnings.simplefilter("ignore")
        yield


def test_chat_streams_reply_and_panel() -> None:
    backend = FakeBackend()
    updates = list(chat_controller(backend).chat("  Hi!  ", [], *SETTINGS, Session()))
    assert len(updates) == 1 + 4 + 1  # user message, four rounds, finished
    history, box, tokens, numbers, plot, plot_empty = updates[0]
    assert history == [{"role": "user", "content": "Hi!"}] and box == ""
    # Before the first round the plot is hidden behind its empty-state line.
    assert plot["visible"] is False and plot_empty["visible"] is True
    partial = updates[2][0][-1]["content"]
    final_history, _, tokens, numbers, plot, plot_empty = updates[-1]
    assert partial == "Hello there, friend"
    assert final_history[-1] == {
        "role": "assistant",
        "content": "Hello there, friend how are you today?",
    }
    assert (" there,", HEAD_LABEL) in tokens
    assert "| last acceptance length | 4 |" in numbers and "Finished (end of reply)" in numbers
    assert plot["value"]["acceptance length"].tolist() == [3, 1, 4]
    assert plot["visible"] is True and plot_empty["visible"] is False
    messages, config, system = backend.calls[-1][1]
    assert messages == [{"role": "user", "content": "Hi!"}] and system is None
    assert config.mode == "eagle" and config.max_new_tokens == 64 and config.tree.auto


def test_chat_sends_history_settings_and_skips_error_notes() -> None:
    backend = FakeBackend()
    history = [
        {"role": "user", "content": [{"type": "text", "text": "first"}], "metadata": None},
        {"role": "assistant", "content": "answer"},
        {"role": "assistant", "content": "⚠ boom", "metadata": {"title": ERROR_TITLE}},
    ]
    settings = ("Be brief.", "vanilla", 0.7, 0.9, 32, False, 12, 4, 3)
    list(chat_controller(backend).chat("second", history, *settings, Session()))
    messages, config, system = backend.calls[-1][1]
    assert messages == [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "answer"},
        {"role": "user", "content": "second"},
    ]
    assert system == "Be brief."
    assert config.mode == "vanilla" and config.sampling.temperature == 0.7
    assert config.sampling.top_p == 0.9
    assert config.tree == TreeConfig(total_tokens=12, depth=4, top_k=3)


def test_chat_rejects_empty_message_and_bad_settings() -> None:
    controller = chat_controller(FakeBackend())
    with pytest.raises(gr.Error, match="Type a message"):
        list(controller.chat("   ", [], *SETTINGS, Session()))
    bad_tree = ("", "eagle", 0.0, 1.0, 64, False, 500, 2, 2)
    with pytest.raises(gr.Error, match="exceeds what depth=2"):
        list(controller.chat("hi", [], *bad_tree, Session()))


def test_generation_error_is_shown_not_swallowed() -> None:
    failed = GenerationFailed("r", "no_model", "no model is loaded", "load a target first")
    backend = FakeBackend(fail_with=failed)
    history, _, _, numbers, *_ = list(
        chat_controller(backend).chat("hi", [], *SETTINGS, Session())
    )[-1]
    assert history[-2] == {"role": "assistant", "content": "Hello"}  # the partial reply stays
    assert history[-1]["metadata"] == {"title": ERROR_TITLE}
    assert "no model is loaded" in history[-1]["content"]
    assert "load a target first" in numbers
    assert backend_messages(history) == backend_messages(history[:-1])


def test_regenerate_replaces_the_last_reply() -> None:
    backend = FakeBackend()
    history = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "old"},
    ]
    final = list(chat_controller(backend).regenerate(history, *SETTINGS, Session()))[-1][0]
    assert [m["content"] for m in final] == [
        "q1",
        "a1",
        "q2",
        "Hello there, friend how are you today?",
    ]
    assert backend.calls[-1][1][0][-1] == {"role": "user", "content": "q2"}
    with pytest.raises(gr.Error, match="Nothing to regenerate"):
        list(chat_controller(backend).regenerate([], *SETTINGS, Session()))


def test_stop_reaches_a_running_generation() -> None:
    controller, session = chat_controller(FakeBackend(delay_s=0.2)), Session()
    updates = controller.chat("hi", [], *SETTINGS, session)
    next(updates), next(updates)  # user message, first round
    threading.Timer(0.05, controller.stop, args=(session,)).start()
    rest = list(updates)
    assert "Finished (stopped)" in rest[-1][3]
    assert rest[-1][0][-1]["content"].startswith("Hello")
    assert len(rest) < 4


def test_clear_and_baseline() -> None:
    backend, session = FakeBackend(), Session()
    controller = chat_controller(backend)
    history, box, tokens, numbers, plot, plot_empty = controller.clear(session)
    assert history == [] and box == "" and tokens == [] and plot["value"].empty
    assert plot["visible"] is False and plot_empty["visible"] is True
    assert "50.0 tokens/s" in controller.measure_baseline(session)
    final_numbers = list(controller.chat("hi", [], *SETTINGS, session))[-1][3]
    assert "| vanilla baseline (measured) | 50.0 tokens/s |" in final_numbers
    backend.loaded = None
    with pytest.raises(gr.Error, match="Load a model first"):
        controller.measure_baseline(session)


def test_race_streams_both_lanes_and_the_verdict() -> None:
    backend = FakeBackend()
    settings = ("", 0.0, 1.0, 64, True, 16, 5, 4)
    updates = list(RaceController(backend, 0.0, 0.0).race("Why?", *settings, Session()))
    assert len(updates) > 3
    *_, first_plot, first_empty = updates[0]
    assert first_plot["visible"] is False and first_empty["visible"] is True
    vanilla_text, vanilla_md, eagle_text, eagle_md, verdict, plot, plot_empty = updates[-1]
    assert "".join(t for t, _ in vanilla_text) == "".join(t for t, _ in eagle_text)
    assert all(label != HEAD_LABEL for _, label in vanilla_text)
    assert any(label == HEAD_LABEL for _, label in eagle_text)
    assert "vanilla: 11.2 tokens/s" in vanilla_md and "EAGLE: 22.5 tokens/s" in eagle_md
    assert "EAGLE speedup: 2.00×" in verdict and "Identical output" in verdict
    assert set(plot["value"]["lane"]) == {"vanilla", "EAGLE"}
    assert plot["visible"] is True and plot_empty["visible"] is False
    assert backend.calls[-1][1][0] == [{"role": "user", "content": "Why?"}]
    with pytest.raises(gr.Error):
        list(RaceController(backend, 0.0, 0.0).race(" ", *settings, Session()))


def test_model_manager_select_plan_download_load() -> None:
    backend = FakeBackend()
    controller = ModelsController(backend)
    target, head, dtype, total, depth, top_k, details = controller.select_pair("gated-pair")
    assert (target, head, dtype, total, depth, top_k) == (
        "org/target",
        "org/head",
        "float32",  # the catalog's float16 is for GPUs; the fake backend is a plain CPU
        60,
        6,
        10,
    )
    assert "Gated target" in details and "14.30 GB" in details
    assert "Hub repo ids" in controller.select_pair(CUSTOM)[-1]
    assert "**To download:** 1.5 GB" in controller.check_plan(" org/target ", "", "auto", "8bit")
    assert backend.calls[-1] == ("plan", ("org/target", None, "auto", "8bit"))
    assert "enter a target" in controller.check_plan("", "", "auto", "none")

    updates = list(controller.download("org/target", "org/head", Session()))
    bar, status = updates[1]
    assert 'value="0.500"' in bar and "download: 500.0 kB / 1.0 MB (50%)" in status
    bar, status = updates[-1]
    assert 'value="1.000"' in bar
    assert status.startswith("✓ Downloaded: `/cache/org/target` and `/cache/org/head`")

    loads = list(controller.load("org/target", "org/head", "auto", "4bit"))
    bar, status, header = loads[0]
    assert "<progress" in bar and "resolve: 0 / 3 steps" in status
    bar, status, header = loads[-1]
    assert status.startswith("✓ Loaded in") and "`org/target`" in header
    assert backend.calls[-1][1].quantization == "4bit"

    bar, status, header = list(controller.load("missing/model", "", "auto", "none"))[-1]
    assert bar == "" and "missing/model is not on the Hub" in status and "check the id" in status
    with pytest.raises(gr.Error, match="quantization must be"):
        list(controller.load("org/target", "", "auto", "2bit"))

    bar, status, header = controller.unload()
    assert bar == "" and "No model loaded" in header and backend.loaded is None


def test_reset_tuning_says_what_happened() -> None:
    backend = FakeBackend(loaded=replace(make_info(), tree_tuning="resumed"))
    controller = ModelsController(backend)
    assert "resumes from what earlier runs" in controller.header()
    status, header = controller.reset_tuning()
    assert status.startswith("✓ The tree tuner forgot") and "from scratch" in header
    backend.loaded = None
    status, header = controller.reset_tuning()
    assert "no model is loaded" in status and "No model loaded" in header


def test_tree_config_auto_and_manual() -> None:
    assert tree_config(True, 500, 1, 1) == TreeConfig(auto=True)
    assert tree_config(False, 12.0, 5.0, 4.0) == TreeConfig(12, 5, 4)


def test_session_stop_switch_is_per_run_and_copies_fresh() -> None:
    import copy

    session = Session()
    first = session.start("chat")
    assert session.stop("chat") and first.cancel.is_set() and not first.discarded
    second = session.start("chat")
    assert not second.cancel.is_set() and not session.stop("race")
    assert session.stop("chat", discard=True) and second.discarded
    assert copy.deepcopy(session).runs == {}


def test_clear_during_a_reply_discards_its_output() -> None:
    controller, session = chat_controller(FakeBackend(delay_s=0.05)), Session()
    updates = controller.chat("hi", [], *SETTINGS, session)
    next(updates), next(updates)
    history, *_ = controller.clear(session)
    assert history == [] and list(updates) == []  # nothing comes back to refill the chat


def _args(**overrides) -> argparse.Namespace:
    values = dict(pair=None, target=None, head=None, dtype=None, quantize="none")
    return argparse.Namespace(**(values | overrides))


def test_startup_pair_and_missing_demo(tmp_path) -> None:
    backend = FakeBackend()
    config, selected, notice = startup_pair(backend, _args())
    assert selected == "demo" and config.target == "/x/demo/target" and notice == DEMO_MISSING
    assert "python launch.py make-demo" in notice
    config, selected, notice = startup_pair(
        backend, _args(target="org/t", head="org/h", quantize="8bit")
    )
    assert (config.target, config.head, config.quantization, selected, notice) == (
        "org/t",
        "org/h",
        "8bit",
        None,
        "",
    )


def test_startup_pair_from_the_catalog() -> None:
    backend = FakeBackend()
    config, selected, notice = startup_pair(backend, _args(pair="gated-pair", quantize="4bit"))
    assert (config.target, config.head, config.quantization, selected, notice) == (
        "org/target",
        "org/head",
        "4bit",
        "gated-pair",
        "",
    )
    config, _, _ = startup_pair(backend, _args(pair="gated-pair", head="org/other-head"))
    assert config.head == "org/other-head"
    with pytest.raises(ConfigError, match="unknown pair 'nope'") as info:
        startup_pair(backend, _args(pair="nope"))
    assert "demo" in info.value.hint
    with pytest.raises(ConfigError, match="--pair or --target"):
        startup_pair(backend, _args(pair="demo", target="org/t"))


def test_exposure_needs_auth() -> None:
    check_exposure("127.0.0.1", False, None)
    check_exposure("0.0.0.0", False, ("u", "p"))
    with pytest.raises(ConfigError, match="host 0.0.0.0"):
        check_exposure("0.0.0.0", False, None)
    with pytest.raises(ConfigError, match="share link"):
        check_exposure("127.0.0.1", True, None)
    assert parse_auth("alice:s3:cret") == ("alice", "s3:cret")
    assert parse_auth(None) is None
    for bad in ("alice", ":pw", "alice:"):
        with pytest.raises(ConfigError, match="USER:PASS"):
            parse_auth(bad)


def test_build_app_names_endpoints_and_shares_the_model_group() -> None:
    from app.main import build_app

    demo = build_app(FakeBackend())
    fns = {fn.api_name: fn for fn in demo.fns.values()}
    for name in (
        "chat",
        "regenerate",
        "stop",
        "clear",
        "baseline",
        "race",
        "race_stop",
        "plan",
        "download",
        "load",
        "unload",
        "reset_tuning",
        "status",
    ):
        assert name in fns, name
    model_users = ("chat", "regenerate", "baseline", "race", "load", "unload", "reset_tuning")
    assert {fns[name].concurrency_id for name in model_users} == {"model"}
    assert fns["stop"].concurrency_limit is None and fns["race_stop"].concurrency_limit is None


def test_run_launches_on_loopback_with_assets(monkeypatch) -> None:
    import gradio as gr

    import app.main as main

    seen: dict = {}
    monkeypatch.setattr(main, "Backend", FakeBackend)
    monkeypatch.setattr(gr.Blocks, "launch", lambda self, **kwargs: seen.update(kwargs))
    args = argparse.Namespace(
        host="127.0.0.1",
        port=7999,
        share=False,
        auth=None,
        pair=None,
        target="org/t",
        head="org/h",
        quantize="none",
        dtype=None,
        no_browser=True,
    )
    assert main.run(args) == 0
    assert seen["server_name"] == "127.0.0.1" and seen["server_port"] == 7999
    assert seen["share"] is False and seen["auth"] is None and seen["inbrowser"] is False
    assert "accept-tokens" in seen["css"] and "chat-stop" in seen["js"]
    monkeypatch.setattr(main, "Backend", lambda: pytest.fail("must refuse before loading"))
    with pytest.raises(ConfigError):
        main.run(argparse.Namespace(**{**vars(args), "host": "0.0.0.0"}))


def test_speedup_is_an_estimate_until_measured() -> None:
    backend, session = FakeBackend(calibrated_speed=20.0), Session()
    controller = chat_controller(backend)
    numbers = list(controller.chat("hi", [], *SETTINGS, session))[-1][3]
    assert "| vanilla speed (estimate, not measured) | ≈ 20.0 tokens/s |" in numbers
    assert "decode speedup (estimate) | ≈ " in numbers and ESTIMATE_NOTE in numbers
    assert "(measured)" not in numbers
    # A race measures vanilla decoding; from then on the panel shows the measured figure.
    race = RaceController(backend, 0.0, 0.0)
    list(race.race("Why?", "", 0.0, 1.0, 64, True, 16, 5, 4, session))
    numbers = list(controller.chat("hi", [], *SETTINGS, session))[-1][3]
    assert "vanilla baseline (measured)" in numbers and "estimate" not in numbers
    # Without calibration (e.g. vanilla-only use) there is no estimate to show.
    numbers = list(chat_controller(FakeBackend()).chat("hi", [], *SETTINGS, Session()))[-1][3]
    assert "estimate" not in numbers and "speedup" not in numbers
