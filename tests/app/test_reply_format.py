"""Chat bubbles show model text faithfully: real replies of the bundled demo pair (code without
fences, arithmetic with ``*``) rendered through a CommonMark renderer keep their indentation
and get no accidental emphasis; Markdown a reply really uses still renders."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from app.chat_tab import ChatController, backend_messages
from app.reply_format import reply_markdown
from app.session import Session
from backend.config import GenerationConfig, LoadConfig
from backend.events import Finished
from backend.services.loading import load_pair
from backend.services.prompting import prompt_ids
from tests.app.fakes import FakeBackend

DEMO = Path(__file__).resolve().parents[2] / "assets" / "demo"
CODE_PROMPT = "Write a Python function that returns the sum of a list of numbers."
ARITHMETIC_PROMPT = (
    "Tom has 12 apples. He gives 5 to his friend and buys 8 more. How many apples does he have now?"
)
# Gradio's chatbot renders GFM with single newlines as line breaks; CommonMark plus those is
# close enough to catch emphasis, lost indentation and swallowed tags.
RENDERER = MarkdownIt("commonmark", {"breaks": True, "html": True}).enable("strikethrough")


def render(markdown: str) -> str:
    return RENDERER.render(markdown)


def visible_text(rendered: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", rendered))


@pytest.fixture(scope="module")
def demo_replies() -> dict[str, str]:
    """Greedy replies of the bundled demo pair, generated here (not scripted)."""
    if not (DEMO / "head-eagle3" / "config.json").is_file():
        pytest.skip("demo pair not built (python launch.py make-demo)")
    pair = load_pair(LoadConfig(str(DEMO / "target"), str(DEMO / "head-eagle3"), dtype="float32"))
    replies = {}
    for prompt in (CODE_PROMPT, ARITHMETIC_PROMPT):
        ids = prompt_ids(pair.tokenizer, [{"role": "user", "content": prompt}])
        config = GenerationConfig(max_new_tokens=48)
        events = list(pair.engine.generate(ids, config))
        assert isinstance(events[-1], Finished)
        replies[prompt] = events[-1].summary.text
    return replies


def test_real_unfenced_code_keeps_its_indentation(demo_replies: dict[str, str]) -> None:
    reply = demo_replies[CODE_PROMPT]
    indented = [line for line in reply.splitlines() if line.startswith((" ", "\t"))]
    assert indented, f"the demo pair's code reply should have indented lines: {reply!r}"
    assert "```" not in reply  # the case at hand: code written without a fence
    rendered = render(reply_markdown(reply))
    blocks = [
        html.unescape(b) for b in re.findall(r"<pre><code>(.*?)</code></pre>", rendered, re.S)
    ]
    assert blocks, rendered
    for line in indented:
        assert any(line in block.splitlines() for block in blocks), (line, blocks)
    # Nothing the model wrote is lost: every non-blank line is shown.
    shown = visible_text(rendered)
    for line in reply.splitlines():
        assert line.strip() in shown, (line, shown)
    # Unescaped, the same reply loses its indentation: the failure this guards against.
    assert "<pre>" not in render(reply)


def test_real_arithmetic_stars_are_not_emphasis(demo_replies: dict[str, str]) -> None:
    reply = demo_replies[ARITHMETIC_PROMPT]
    assert reply.count("*") >= 2, f"the demo pair's arithmetic should use '*': {reply!r}"
    rendered = render(reply_markdown(reply))
    assert "<em>" not in rendered and "<strong>" not in rendered
    assert visible_text(rendered).replace("\n", "") == reply.replace("\n", "")
    assert "<em>" in render(reply)  # raw, the asterisks turn into italics


def test_markdown_a_reply_really_uses_still_renders() -> None:
    reply = (
        "Use **bold** or *this*, `a*b`.\n\n```python\ndef add(a, b):\n    return a * b\n```\n# Done"
    )
    rendered = render(reply_markdown(reply))
    assert "<strong>bold</strong>" in rendered and "<em>this</em>" in rendered
    assert "<code>a*b</code>" in rendered
    assert '<code class="language-python">def add(a, b):\n    return a * b\n</code>' in rendered
    assert "<h1>Done</h1>" in rendered


@pytest.mark.parametrize(
    "text",
    [
        "see <|user|> and a<b or </div>",
        "__init__ and snake_case_name, 2*3*4 = 24",
        "~5 to ~10 minutes, a ` stray tick",
        "a \\* backslash and &amp; literally",
        "x\n===",
        " I am a reply that starts with the space its first token decodes to.",
    ],
)
def test_plain_text_shows_exactly(text: str) -> None:
    rendered = render(reply_markdown(text))
    assert "<em>" not in rendered and "<s>" not in rendered and "<h1>" not in rendered
    assert "<pre>" not in rendered
    assert visible_text(rendered).replace("\n", "").strip() == text.replace("\n", "").strip()


def test_an_unclosed_fence_while_streaming_shows_as_code() -> None:
    rendered = render(reply_markdown("Here:\n```python\ndef f():\n    return 1"))
    assert "<pre><code" in rendered and "    return 1" in rendered


def test_the_model_gets_back_its_own_text_not_the_display_form() -> None:
    reply = "He has 12*2=12 apples.\nSo 12*2."
    backend = FakeBackend(script=((((reply, "target"),), 0),))
    session = Session()
    controller = ChatController(backend, min_refresh_s=0.0, plot_refresh_s=0.0)
    history = list(
        controller.chat("How many?", [], "", "eagle", 0.0, 1.0, 64, True, 16, 5, 4, session)
    )[-1][0]
    assert history[-1]["content"] == reply_markdown(reply) != reply
    list(controller.chat("And now?", history, "", "eagle", 0.0, 1.0, 64, True, 16, 5, 4, session))
    sent = backend.calls[-1][1][0]
    assert sent[1] == {"role": "assistant", "content": reply}
    assert backend_messages(history)[1]["content"] == reply_markdown(reply)  # without the map
