"""The real app over the real backend (tiny saved pair), driven through gradio_client.

Checks the public endpoints a script would use: /chat streams several partial updates and a
coloured panel, /stop reaches the running generation of the same client session, /race
returns both speeds and the identity verdict, /plan and /load work on local folders."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest
from gradio_client import Client

from app.render import HEAD_LABEL
from tests.app.conftest import LiveApp


@pytest.fixture(scope="module")
def client(live_app: LiveApp) -> Iterator[Client]:
    """One client, so one Gradio session: /stop reaches that session's running /chat."""
    client = Client(live_app.url, verbose=False)
    yield client
    client.close()


def tokens_per_s(markdown: str, label: str = "tokens/s") -> float:
    match = re.search(rf"{re.escape(label)}\D*?([\d.]+)", markdown)
    assert match, markdown
    return float(match.group(1))


def reply_text(message: dict) -> str:
    content = message["content"]
    return content if isinstance(content, str) else "".join(part["text"] for part in content)


def test_chat_streams_partial_updates_and_fills_the_panel(client: Client) -> None:
    job = client.submit("hello world", [], api_name="/chat", max_new_tokens=120)
    partials = [output for output in job]
    history, box, tokens, stats, plot, _ = job.result()
    assert len(partials) > 2, "the reply should arrive in several updates"
    lengths = [len(reply_text(p[0][-1])) for p in partials if p[0][-1]["role"] == "assistant"]
    assert lengths == sorted(lengths) and lengths[0] < lengths[-1]
    assert history[0]["role"] == "user" and history[-1]["role"] == "assistant"
    assert reply_text(history[-1]).strip()
    labels = {piece["class_or_confidence"] for piece in tokens}
    assert HEAD_LABEL in labels, "the easy pair's drafts should be accepted"
    assert tokens_per_s(stats) > 0
    assert "| new tokens / rounds | 120 /" in stats and "Finished (max new tokens reached)" in stats

    second = client.predict("and again", history, api_name="/chat", max_new_tokens=8)[0]
    assert [m["role"] for m in second] == ["user", "assistant", "user", "assistant"]


def test_stop_cancels_the_running_reply(client: Client) -> None:
    job = client.submit("Tell me a story", [], api_name="/chat", max_new_tokens=450)
    deadline = time.monotonic() + 30
    while len(job.outputs()) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    client.predict(api_name="/stop")
    history, _, _, stats, *_ = job.result(timeout=60)
    assert "Finished (stopped)" in stats
    produced = int(re.search(r"new tokens / rounds \| (\d+)", stats).group(1))
    assert 0 < produced < 450


def test_model_is_free_after_the_client_tests(live_app: LiveApp) -> None:
    deadline = time.monotonic() + 5
    while live_app.backend.status().busy and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not live_app.backend.status().busy


def test_race_reports_both_speeds_and_identity(client: Client) -> None:
    job = client.submit("Tell me a story", api_name="/race", max_new_tokens=80)
    partials = [output for output in job]
    vanilla_text, vanilla_md, eagle_text, eagle_md, verdict, *_ = job.result()
    assert len(partials) > 2
    assert tokens_per_s(vanilla_md, "vanilla:") > 0 and tokens_per_s(eagle_md, "EAGLE:") > 0
    assert re.search(r"EAGLE speedup: [\d.]+×", verdict)
    assert "Identical output" in verdict  # greedy EAGLE is lossless
    assert "".join(p["token"] for p in vanilla_text) == "".join(p["token"] for p in eagle_text)


def test_plan_and_load_local_pair(client: Client, live_app: LiveApp) -> None:
    target, head = str(live_app.pair.target), str(live_app.pair.head)
    plan = client.predict(target, head, "auto", "none", api_name="/plan")
    assert "local folder" in plan and "Memory for the weights" in plan
    bar, status, header = client.predict(target, head, "auto", "none", api_name="/load")
    assert status.startswith("✓ Loaded") and target in header and "<progress" in bar
    bar, status, header = client.predict("/no/such/model", "", "auto", "none", api_name="/load")
    assert status.startswith("⚠") and "/no/such/model" in status
    client.predict(target, head, "auto", "none", api_name="/load")  # leave the pair loaded
