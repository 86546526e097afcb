"""Refresh the README's picture, assets/screenshot.png: the chat tab after one streamed reply,
full page, in headless Debian chromium (same setup as test_browser.py).

    python -m tests.app.browser.screenshot                     # the bundled demo pair
    python -m tests.app.browser.screenshot --target DIR --head DIR --prompt "Tell me about owls"

Not a test: it needs a pair that writes readable text (the demo pair), which the test suite
does not build. The PNG is palette-quantised when it would exceed ``--max-kb``.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from app.main import build_app, launch_options  # noqa: E402
from backend.api import Backend  # noqa: E402
from backend.config import LoadConfig  # noqa: E402
from backend.events import Loaded  # noqa: E402
from tests.app.browser.test_browser import CHROMIUM, CHROMIUM_ARGS  # noqa: E402

logger = logging.getLogger(__name__)

OUT = ROOT / "assets" / "screenshot.png"
DEFAULT_PROMPTS = ("Tell me about yourself.", "Write a Python function that adds two numbers.")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def shrink(path: Path, max_kb: int) -> None:
    """Palette-quantise a screenshot that is too large (UI pictures survive 256 colours)."""
    if path.stat().st_size <= max_kb * 1024:
        return
    from PIL import Image

    with Image.open(path) as image:
        image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(
            path, optimize=True
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=str(ROOT / "assets" / "demo" / "target"))
    parser.add_argument("--head", default=str(ROOT / "assets" / "demo" / "head-eagle3"))
    parser.add_argument(
        "--prompt",
        action="append",
        dest="prompts",
        help="a user turn (repeatable); default: two turns the demo answers well",
    )
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--max-kb", type=int, default=300)
    args = parser.parse_args(argv)
    args.prompts = args.prompts or list(DEFAULT_PROMPTS)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    from playwright.sync_api import sync_playwright

    backend = Backend()
    config = LoadConfig(target=args.target, head=args.head)
    last = list(backend.load(config))[-1]
    if not isinstance(last, Loaded):
        logger.error("cannot load the pair: %s", last)
        return 2
    demo = build_app(backend, initial=config)
    demo.queue()
    port = free_port()
    demo.launch(
        server_name="127.0.0.1",
        server_port=port,
        prevent_thread_lock=True,
        quiet=True,
        **launch_options(),
    )
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 860})
            page.set_default_timeout(120_000)
            page.goto(f"http://127.0.0.1:{port}")
            page.wait_for_selector("#chat-input textarea")
            page.click("#chat-settings .label-wrap")
            box = page.locator("#chat-max-new-tokens input[type=number]")
            box.fill(str(args.max_new_tokens))
            box.press("Tab")
            page.click("#chat-settings .label-wrap")  # fold the settings again
            page.click("#chat-baseline-btn")  # the panel then shows the measured speedup
            page.wait_for_function(
                "() => document.querySelector('#chat-baseline').innerText.includes('tokens/s')"
            )
            for turn, prompt in enumerate(args.prompts, start=1):
                page.fill("#chat-input textarea", prompt)
                page.press("#chat-input textarea", "Enter")
                page.wait_for_function(
                    f"() => document.querySelectorAll('#chatbot [data-testid=bot]').length >= {turn}"
                    " && document.querySelector('#accept-stats').innerText.includes('Finished')"
                )
            page.wait_for_timeout(1500)  # let the plot draw its last frame
            page.locator("#chatbot [role=log]").evaluate("log => { log.scrollTop = 0; }")
            page.screenshot(path=args.out, full_page=True)
            browser.close()
    finally:
        demo.close()
    shrink(args.out, args.max_kb)
    logger.info("wrote %s (%d KB)", args.out, args.out.stat().st_size // 1024)
    return 0


if __name__ == "__main__":
    sys.exit(main())
