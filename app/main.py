"""``python launch.py app``: the EagleChat web app (chat, EAGLE-vs-vanilla race, model manager).

    python launch.py app                       # the bundled demo pair on http://127.0.0.1:7860
    python launch.py app --pair gemma3-270m    # a catalog pair
    python launch.py app --target Qwen/Qwen3-1.7B --head AngelSlim/Qwen3-1.7B_eagle3 --quantize 4bit
    python launch.py app --host 0.0.0.0 --auth me:secret   # reachable from the network

Only loopback is served without a password: any other host, or ``--share``, needs ``--auth``.
The backend is created here and passed into :func:`build_app`; nothing in ``app/`` holds a
model in a module global. Theme, CSS (assets/app.css) and JS (assets/app.js) go to
``launch()``, as Gradio 6 wants.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import gradio as gr

from app.chat_tab import build_chat_tab, wire_chat_tab
from app.models_tab import REMOTE, build_models_tab, wire_models_tab
from app.race_tab import build_race_tab, wire_race_tab
from app.render import error_markdown, pair_info_markdown
from app.session import Session
from backend.api import Backend
from backend.config import LoadConfig
from backend.errors import ConfigError, EagleChatError
from backend.events import Loaded, LoadFailed, Progress

logger = logging.getLogger(__name__)

ASSETS = Path(__file__).resolve().parents[1] / "assets"
DEMO_PAIR = "demo"
DEFAULT_PORT = 7860
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
OFFLINE_NOTICE = (
    "**Hub offline mode**: {}. Local folders and models already downloaded load as usual; "
    "downloads are off until the app is restarted with a connection (and without `--offline`)."
)
DEMO_MISSING = (
    "**The bundled demo pair is not built yet** (`assets/demo/target`, "
    "`assets/demo/head-eagle3`). Build it offline with `python launch.py make-demo` (trains the "
    "small target if missing, then its EAGLE heads), then restart; or pick another pair below, "
    "press **Download** and **Load**."
)


def build_app(
    backend: Backend,
    *,
    initial: LoadConfig | None = None,
    selected: str | None = None,
    notice: str = "",
) -> gr.Blocks:
    """All tabs over one backend. ``initial``/``selected`` pre-fill the model manager with the
    pair loaded at start; ``notice`` is shown at the top of the manager (e.g. demo missing)."""
    try:
        pairs = backend.catalog()
    except EagleChatError as err:
        logger.warning("catalog unreadable: %s", err)
        pairs, notice = (
            [],
            f"{notice}\n\n{error_markdown(LoadFailed(err.code, err.message, err.hint))}",
        )
    with gr.Blocks(title="EagleChat") as demo:
        session = gr.State(Session())
        with gr.Row(elem_id="app-header"):
            gr.Markdown("## EagleChat — lossless EAGLE speculative decoding")
        header = gr.Markdown(
            pair_info_markdown(backend.status().loaded), label="Loaded pair", elem_id="loaded-pair"
        )
        with gr.Tabs():
            with gr.Tab("Chat", id="chat"):
                chat = build_chat_tab()
            with gr.Tab("EAGLE vs vanilla", id="race"):
                race = build_race_tab()
            with gr.Tab("Models", id="models"):
                models = build_models_tab(pairs, initial, selected, notice)
        wire_chat_tab(chat, backend, session, models.tree)
        wire_race_tab(race, backend, session, models.tree)
        controller = wire_models_tab(models, backend, session, header)
        demo.load(
            controller.refresh,
            outputs=[models.status, header],
            api_name="status",
            concurrency_limit=None,
        )
    return demo


def launch_options() -> dict[str, Any]:
    """Theme, CSS and JS for ``launch()`` (Gradio 6 takes them there, not in Blocks)."""
    return {
        "theme": gr.themes.Soft(primary_hue="emerald", secondary_hue="slate"),
        "css": (ASSETS / "app.css").read_text(encoding="utf-8"),
        "js": (ASSETS / "app.js").read_text(encoding="utf-8"),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="interface to serve on; anything but loopback needs --auth",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument(
        "--share",
        action="store_true",
        help="public gradio.live link (off by default; needs --auth)",
    )
    parser.add_argument("--auth", metavar="USER:PASS", help="require this login")
    parser.add_argument(
        "--pair", help="catalog pair to load at start (default: demo) instead of --target/--head"
    )
    parser.add_argument("--target", help="target to load at start (default: the demo pair)")
    parser.add_argument("--head", help="EAGLE head to load with --target (or --pair's own)")
    parser.add_argument(
        "--quantize",
        choices=["none", "8bit", "4bit"],
        default="none",
        help="bitsandbytes quantization of the target",
    )
    parser.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16", "float16"],
        default=None,
        help="default: the catalog's, else auto",
    )
    parser.add_argument(
        "--remote",
        metavar="URL",
        help="chat with this OpenAI-compatible engine (vLLM, SGLang) instead of a local model",
    )
    parser.add_argument(
        "--remote-baseline",
        metavar="URL",
        help="with --remote: a server of the same model without speculation, for the race tab",
    )
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser tab")
    parser.add_argument(
        "--offline",
        action="store_true",
        help="never contact the Hub (local folders and cached models only); without it the "
        "app goes offline by itself when the Hub cannot be reached",
    )


def parse_auth(value: str | None) -> tuple[str, str] | None:
    if value is None:
        return None
    user, sep, password = value.partition(":")
    if not sep or not user or not password:
        raise ConfigError("--auth must look like USER:PASS", hint="e.g. --auth alice:s3cret")
    return user, password


def check_exposure(host: str, share: bool, auth: tuple[str, str] | None) -> None:
    """Refuse to serve beyond this machine without a login."""
    if auth is None and (share or host not in LOOPBACK_HOSTS):
        where = "a public share link" if share else f"host {host}"
        raise ConfigError(
            f"refusing to serve on {where} without a password",
            hint="add --auth USER:PASS, or keep the default --host 127.0.0.1",
        )


def startup_pair(
    backend: Backend, args: argparse.Namespace
) -> tuple[LoadConfig | None, str | None, str]:
    """The pair to load at start: --target/--head, a catalog --pair, else the demo pair when
    its files exist.

    Returns (config, catalog name, notice); the notice explains a missing demo."""
    pair_name = args.pair
    if args.target:
        if pair_name:
            raise ConfigError("give --pair or --target, not both")
        config = LoadConfig(
            target=args.target,
            head=args.head,
            dtype=args.dtype or "auto",
            quantization=args.quantize,
        )
        return config, None, ""
    if pair_name:
        pair = backend.find_pair(pair_name)
    else:
        pair = next((pair for pair in backend.catalog() if pair.name == DEMO_PAIR), None)
        if pair is None:
            return None, None, ""
    config = LoadConfig(
        target=pair.target,
        head=args.head or pair.head,
        dtype=args.dtype or backend.default_dtype(pair.dtype),
        quantization=args.quantize,
    )
    if pair.name == DEMO_PAIR and not (Path(pair.target).is_dir() and Path(pair.head).is_dir()):
        logger.warning("demo pair not built (%s, %s)", pair.target, pair.head)
        return config, DEMO_PAIR, DEMO_MISSING
    return config, pair.name, ""


def load_at_start(backend: Backend, config: LoadConfig) -> str:
    """Load before serving; a failure becomes the manager's notice instead of a crash, so
    the user can fix it in the UI."""
    for event in backend.load(config):
        if isinstance(event, Progress):
            logger.info("%s: %s", event.stage, event.message)
        elif isinstance(event, Loaded):
            logger.info("loaded %s", event.info.target)
        elif isinstance(event, LoadFailed):
            logger.error("could not load %s: %s", config.target, event.message)
            return f"Could not load `{config.target}` at start.\n\n{error_markdown(event)}"
    return ""


def prepare(args: argparse.Namespace) -> tuple[Backend, LoadConfig | None, str | None, str]:
    """Everything before serving: online or offline, the backend, the pair loaded at start.
    Returns (backend, config, catalog name, notice for the model manager)."""
    backend = Backend()
    offline = backend.choose_hub_mode(asked_offline=getattr(args, "offline", False))
    config, selected, notice = startup_pair(backend, args)
    if config is not None and not notice:
        notice = load_at_start(backend, config)
    if offline:
        logger.warning("Hub offline mode for this run: %s", offline)
        notice = "\n\n".join(part for part in (notice, OFFLINE_NOTICE.format(offline)) if part)
    return backend, config, selected, notice


def connect_at_start(backend: Backend, args: argparse.Namespace) -> tuple[LoadConfig, str, str]:
    """Remote mode: load --target/--head or --pair here only when given (the race's local
    vanilla lane), then connect; a failure becomes the manager's notice, the app still starts."""
    notice = ""
    if args.target or args.pair:
        local, _, _ = startup_pair(backend, args)
        notice = load_at_start(backend, local) if local is not None else ""
    for event in backend.connect_remote(args.remote, getattr(args, "remote_baseline", None)):
        if isinstance(event, LoadFailed):
            logger.error("could not connect to %s: %s", args.remote, event.message)
            notice += f"\n\nCould not connect to `{args.remote}`.\n\n{error_markdown(event)}"
    return LoadConfig(target=args.remote), REMOTE, notice.strip()


def run(args: argparse.Namespace) -> int:
    auth = parse_auth(args.auth)
    check_exposure(args.host, args.share, auth)  # before any slow loading
    if getattr(args, "remote", None):
        backend = Backend()
        config, selected, notice = connect_at_start(backend, args)
    else:
        backend, config, selected, notice = prepare(args)
    demo = build_app(backend, initial=config, selected=selected, notice=notice)
    demo.queue(default_concurrency_limit=1)
    demo.launch(
        server_name=args.host,
        server_port=args.port,
        share=args.share,
        auth=auth,
        inbrowser=not args.no_browser,
        footer_links=["api"],
        **launch_options(),
    )
    return 0
