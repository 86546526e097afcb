"""The app in headless Chromium (Debian's ``chromium`` driven by Playwright's Python package):
a reply streams in, the acceptance panel fills with coloured accepted tokens and numbers, Stop
ends a reply mid-stream, the race shows both speeds and the identity verdict, and the model
manager loads a pair showing its progress. Screenshots go to tests/artifacts/ (git-ignored).

Needs ``apt-get install -y chromium`` and ``pip install playwright==1.65.2`` (never
``playwright install``: the browser comes from Debian). Skipped with a reason otherwise.
The README's picture comes from ``python -m tests.app.browser.screenshot`` (demo pair).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.app.conftest import LiveApp

pytestmark = pytest.mark.browser

# EAGLECHAT_CHROMIUM points at another Chromium build (e.g. /usr/bin/chromium-browser).
CHROMIUM = os.environ.get("EAGLECHAT_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ROOT = Path(__file__).resolve().parents[3]
ARTIFACTS = ROOT / "tests" / "artifacts"
DRAFT_RGB = "52, 211, 153"  # render.SPAN_COLORS[HEAD_LABEL] (#34d399) as the DOM shows it
TIMEOUT_MS = 30_000

# Records every distinct length of the newest bot message as the DOM changes.
WATCH_REPLY = """() => {
  window.__replyLengths = [];
  const root = document.querySelector('#chatbot');
  new MutationObserver(() => {
    const bots = root.querySelectorAll('[data-testid="bot"]');
    if (!bots.length) return;
    const n = bots[bots.length - 1].innerText.length;
    const seen = window.__replyLengths;
    if (!seen.length || seen[seen.length - 1] !== n) seen.push(n);
  }).observe(root, {subtree: true, childList: true, characterData: true});
}"""

# Records every distinct text of an element as the DOM changes.
WATCH_TEXT = """(selector) => {
  window.__texts = [];
  const root = document.querySelector(selector);
  new MutationObserver(() => {
    const text = root.innerText;
    if (window.__texts[window.__texts.length - 1] !== text) window.__texts.push(text);
  }).observe(root, {subtree: true, childList: true, characterData: true});
}"""


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="pip install playwright==1.65.2 for the browser tests"
    )
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install -y chromium")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def page(browser, live_app: LiveApp):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": 1360, "height": 940})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(live_app.url)
    page.wait_for_selector("#chat-input textarea")
    yield page
    context.close()


def open_tab(page, name: str) -> None:
    page.get_by_role("tab", name=name).click()


def set_number(page, slider_id: str, value: int) -> None:
    box = page.locator(f"#{slider_id} input[type=number]")
    box.fill(str(value))
    box.press("Tab")


def send(page, text: str) -> None:
    page.fill("#chat-input textarea", text)
    page.press("#chat-input textarea", "Enter")


def stats_text(page) -> str:
    return page.inner_text("#accept-stats")


def test_reply_streams_and_panel_fills(page) -> None:
    open_tab(page, "Chat")
    # Before the first reply the plot is an empty state, not a chart with "0.000000" axes.
    assert page.locator("#accept-plot-empty").is_visible()
    assert page.locator("#accept-plot canvas, #accept-plot svg").count() == 0
    assert "0.000000" not in page.inner_text(".accept-panel")
    page.evaluate(WATCH_REPLY)
    send(page, "hello world")
    page.wait_for_function(
        "() => document.querySelector('#accept-stats').innerText.includes('Finished')"
    )
    lengths = page.evaluate("window.__replyLengths")
    assert len([n for n in lengths if n > 0]) > 1, f"reply did not stream: {lengths}"
    assert lengths == sorted(lengths)
    reply = page.locator("#chatbot [data-testid='bot']").last.inner_text()
    assert reply.strip()

    styles = page.locator("#accept-tokens .token").evaluate_all(
        "nodes => nodes.map(n => n.getAttribute('style') || '')"
    )
    assert any(DRAFT_RGB in style for style in styles), "no accepted draft token is coloured"
    assert any(DRAFT_RGB not in style for style in styles), "target tokens should look different"
    stats = stats_text(page)
    assert float(re.search(r"tokens/s\s+([\d.]+)", stats).group(1)) > 0
    assert re.search(r"avg acceptance length \(τ\)\s+[\d.]+", stats)
    assert re.search(r"last acceptance length\s+\d+", stats)
    assert re.search(r"tokens per target forward\s+[\d.]+", stats)
    page.locator("#accept-plot canvas, #accept-plot svg").first.wait_for()
    assert not page.locator("#accept-plot-empty").is_visible()
    page.screenshot(path=ARTIFACTS / "chat.png", full_page=True)


@pytest.fixture
def reply_held_after_first_round(live_app: LiveApp, monkeypatch) -> None:
    """The tiny pair finishes 450 tokens in well under a second, faster than a click can land,
    so the backend's stream waits after its first visible text until Stop sets the cancel flag
    (at most TIMEOUT_MS): the click then surely lands mid-reply, and the engine itself must
    notice the flag and end the reply."""
    from backend.events import RoundCompleted

    stream = live_app.backend.stream

    def held(*args, cancel=None, **kwargs):
        held_once = False
        for event in stream(*args, cancel=cancel, **kwargs):
            yield event
            shows_text = isinstance(event, RoundCompleted) and any(
                span.text.strip() for span in event.spans
            )
            if shows_text and not held_once and cancel is not None:
                held_once = True
                cancel.wait(TIMEOUT_MS / 1000)

    monkeypatch.setattr(live_app.backend, "stream", held)


def test_stop_mid_stream(page, reply_held_after_first_round) -> None:
    open_tab(page, "Chat")
    page.click("#chat-clear")  # a fresh context: the tiny model's context is only 512 tokens
    page.wait_for_function("() => !document.querySelector('#chatbot [data-testid=bot]')")
    page.click("#chat-settings button, #chat-settings .label-wrap")
    set_number(page, "chat-max-new-tokens", 450)
    page.evaluate(WATCH_REPLY)
    send(page, "Tell me a long story")
    page.wait_for_function("() => window.__replyLengths.some(n => n > 0)")
    page.click("#chat-stop")
    page.wait_for_function(
        "() => document.querySelector('#accept-stats').innerText.includes('Finished (stopped)')"
    )
    produced = int(re.search(r"new tokens / rounds\s+(\d+)", stats_text(page)).group(1))
    assert 0 < produced < 450
    page.screenshot(path=ARTIFACTS / "chat-stopped.png", full_page=True)


def test_race_shows_both_speeds_and_identity(page) -> None:
    open_tab(page, "EAGLE vs vanilla")
    assert page.locator("#race-plot-empty").is_visible()
    assert page.locator("#race-plot canvas, #race-plot svg").count() == 0
    page.fill("#race-prompt textarea", "Tell me a story")
    page.click("#race-run")
    page.wait_for_function(
        "() => document.querySelector('#race-verdict').innerText.includes('EAGLE speedup')"
    )
    verdict = page.inner_text("#race-verdict")
    assert "Identical output" in verdict
    assert (
        float(
            re.search(r"vanilla: ([\d.]+) tokens/s", page.inner_text("#race-vanilla-stats")).group(
                1
            )
        )
        > 0
    )
    assert (
        float(re.search(r"EAGLE: ([\d.]+) tokens/s", page.inner_text("#race-eagle-stats")).group(1))
        > 0
    )
    assert page.locator("#race-eagle-text .token").count() > 0
    page.locator("#race-plot canvas, #race-plot svg").first.wait_for()
    assert not page.locator("#race-plot-empty").is_visible()
    page.screenshot(path=ARTIFACTS / "race.png", full_page=True)


def test_model_manager_loads_with_progress(page, live_app: LiveApp) -> None:
    open_tab(page, "Models")
    page.fill("#models-target textarea", str(live_app.pair.target))
    page.fill("#models-head textarea", str(live_app.pair.head))
    page.click("#models-plan-btn")
    page.wait_for_function(
        "() => document.querySelector('#models-plan').innerText.includes('Memory for the weights')"
    )
    page.evaluate(WATCH_TEXT, "#models-status")
    page.click("#models-load-btn")
    page.wait_for_function(
        "() => document.querySelector('#models-status').innerText.includes('Loaded in')"
    )
    texts = page.evaluate("window.__texts")
    progress = [t for t in texts if "Loading" in t]
    assert progress and re.search(r"\d+ / \d+ steps", progress[-1]), texts
    assert str(live_app.pair.target) in page.inner_text("#loaded-pair")
    assert page.locator("#models-progress progress").get_attribute("value") == "1.000"
    page.screenshot(path=ARTIFACTS / "models.png", full_page=True)


def test_models_tab_offers_int8_on_a_cpu_and_a_chat_runs_with_it(page, live_app: LiveApp) -> None:
    open_tab(page, "Models")
    choice = page.locator("#models-quantization label", has_text="int8")
    assert "recommended here" in choice.inner_text()  # the app runs on a CPU
    page.fill("#models-target textarea", str(live_app.pair.target))
    page.fill("#models-head textarea", str(live_app.pair.head))
    choice.click()
    page.click("#models-load-btn")
    page.wait_for_function(  # a new load times the tree costs again: minutes on a busy CPU
        # the page may still show the earlier float32 load's "Loaded in": wait for this one's
        "() => document.querySelector('#models-status').innerText.includes('Loaded in')"
        " && document.querySelector('#loaded-pair').innerText.includes('int8')",
        timeout=10 * TIMEOUT_MS,
    )
    assert "re-quantized to int8" in page.inner_text("#models-status")
    open_tab(page, "Chat")
    send(page, "hello int8")
    page.wait_for_function(
        "() => document.querySelector('#accept-stats').innerText.includes('Finished')"
    )
    assert page.locator("#chatbot [data-testid='bot']").last.inner_text().strip()
    assert live_app.backend.status().loaded.quantization == "int8"
    page.screenshot(path=ARTIFACTS / "models-int8.png", full_page=True)


DEMO = ROOT / "assets" / "demo"
CODE_PROMPT = "Write a Python function that returns the sum of a list of numbers."
ARITHMETIC_PROMPT = (
    "Tom has 12 apples. He gives 5 to his friend and buys 8 more. How many apples does he have now?"
)


@pytest.fixture(scope="module")
def demo_app() -> Iterator[tuple[str, object]]:
    """The app serving the bundled demo pair, whose real replies the bubbles must show."""
    from app.main import build_app, launch_options
    from backend.api import Backend
    from backend.config import LoadConfig
    from backend.events import Loaded
    from tests.app.conftest import free_port

    if not (DEMO / "head-eagle3" / "config.json").is_file():
        pytest.skip("demo pair not built (python launch.py make-demo)")
    backend = Backend()
    config = LoadConfig(str(DEMO / "target"), str(DEMO / "head-eagle3"), dtype="float32")
    assert isinstance(list(backend.load(config))[-1], Loaded)
    demo = build_app(backend, initial=config)
    demo.queue()
    _, url, _ = demo.launch(
        server_name="127.0.0.1",
        server_port=free_port(),
        prevent_thread_lock=True,
        quiet=True,
        **launch_options(),
    )
    yield url, backend
    demo.close()


def demo_reply(backend, prompt: str) -> str:
    """The demo pair's greedy reply, generated here: what the bubble must show."""
    from backend.config import DEFAULT_MAX_NEW_TOKENS, GenerationConfig
    from backend.events import Finished

    config = GenerationConfig(mode="vanilla", max_new_tokens=DEFAULT_MAX_NEW_TOKENS)
    events = list(backend.stream([{"role": "user", "content": prompt}], config))
    assert isinstance(events[-1], Finished), events[-1]
    return events[-1].summary.text


def ask(page, prompt: str):
    if page.locator("#chatbot [data-testid=bot]").count():
        # the reply's bubbles go in the clear's response, which also empties the message box:
        # once they are gone, no late response can empty the prompt typed next
        page.click("#chat-clear")
        page.wait_for_function("() => !document.querySelector('#chatbot [data-testid=bot]')")
    send(page, prompt)
    page.wait_for_function(
        "() => document.querySelector('#accept-stats').innerText.includes('Finished')"
    )
    return page.locator("#chatbot [data-testid='bot']").last


def test_real_demo_replies_render_faithfully(browser, demo_app) -> None:
    url, backend = demo_app
    code, arithmetic = demo_reply(backend, CODE_PROMPT), demo_reply(backend, ARITHMETIC_PROMPT)
    indented = [line for line in code.splitlines() if line.startswith((" ", "\t"))]
    assert indented and "```" not in code, f"expected unfenced indented code: {code!r}"
    assert arithmetic.count("*") >= 2, f"expected arithmetic with '*': {arithmetic!r}"
    context = browser.new_context(
        viewport={"width": 1360, "height": 940}, permissions=["clipboard-read", "clipboard-write"]
    )
    page = context.new_page()
    try:
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(url)
        page.wait_for_selector("#chat-input textarea")

        bubble = ask(page, CODE_PROMPT)  # greedy EAGLE in the UI: the same text as vanilla
        shown_code = bubble.locator("pre code").inner_text().splitlines()
        for line in indented:
            assert line in shown_code, (line, shown_code)  # indentation kept, as code
        shown = bubble.inner_text()
        assert all(line.strip() in shown for line in code.splitlines()), (code, shown)
        page.screenshot(path=ARTIFACTS / "demo-code.png", full_page=True)

        bubble = ask(page, ARITHMETIC_PROMPT)
        assert bubble.locator("em, i").count() == 0, bubble.inner_html()
        assert " ".join(bubble.inner_text().split()) == " ".join(arithmetic.split())
        page.screenshot(path=ARTIFACTS / "demo-arithmetic.png", full_page=True)
        # "Copy message" copies what the bubble shows, not the escaped Markdown behind it.
        page.locator('#chatbot button[aria-label="Copy message"]').last.click()
        copied = page.evaluate("navigator.clipboard.readText()")
        assert "\\" not in copied and copied.split() == arithmetic.split(), copied
    finally:
        context.close()


CONTEXT_RGB = "251, 191, 36"  # render.SPAN_COLORS[CONTEXT_LABEL] (#fbbf24)
LOOPING_PROMPT = "Write the numbers from 1 to 20."  # the demo target answers "1000000..."


def test_tokens_are_coloured_by_who_wrote_them(browser, demo_app, monkeypatch) -> None:
    """Head drafts green, context drafts amber, the target's own tokens grey (rounds take
    head drafts and context drafts in turn, the tuner's choice replaced, on a reply that
    loops); the acceptance plot's title fits inside it and its x axis counts whole rounds."""
    from backend.config import TreeConfig
    from backend.engine.autotune import Arm
    from tests.engine.helpers import CyclingPolicy

    url, backend = demo_app
    chain = TreeConfig(total_tokens=4, depth=3, top_k=1)
    policy = CyclingPolicy([Arm(chain), Arm(None, context=12, chains=1)])
    monkeypatch.setitem(backend.pair.engine.policies, (False, "both"), policy)
    context = browser.new_context(viewport={"width": 1360, "height": 940})
    page = context.new_page()
    try:
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(url)
        page.wait_for_selector("#chat-input textarea")
        page.click("#chat-settings button, #chat-settings .label-wrap")
        set_number(page, "chat-max-new-tokens", 24)  # a few rounds: the plot's x axis is short
        ask(page, LOOPING_PROMPT)
        styles = page.locator("#accept-tokens .token").evaluate_all(
            "nodes => nodes.map(n => n.getAttribute('style') || '')"
        )
        kinds = {
            "head": any(DRAFT_RGB in style for style in styles),
            "context": any(CONTEXT_RGB in style for style in styles),
            "target": any(DRAFT_RGB not in style and CONTEXT_RGB not in style for style in styles),
        }
        assert all(kinds.values()), kinds
        assert re.search(r"drafts accepted: head / context\s+[1-9]\d* / [1-9]\d*", stats_text(page))
        svg = page.locator("#accept-plot svg").first
        svg.wait_for()
        box = svg.bounding_box()
        title = svg.locator(".role-title-text text, .role-title text").first.bounding_box()
        assert box["x"] <= title["x"] and title["x"] + title["width"] <= box["x"] + box["width"]
        ticks = svg.locator("g[aria-label^='X-axis'] .role-axis-label text").evaluate_all(
            "nodes => nodes.map(n => n.textContent)"
        )
        assert ticks and all(re.fullmatch(r"\d+", t) for t in ticks), ticks  # no 1.5, 2.5 ...
        page.screenshot(path=ARTIFACTS / "chat-sources.png", full_page=True)
    finally:
        context.close()
