"""Model manager tab: pick a catalog pair or type target/head ids or folders, see sizes and the
memory estimate, download with progress, choose dtype/quantization and the draft tree, load and
unload without restarting.

Built in two steps (tgw's habit): :func:`build_models_tab` renders the components,
:func:`wire_models_tab` connects them to a :class:`ModelsController`, whose methods are plain
functions of UI values that tests call without a browser.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import gradio as gr

from app.render import (
    error_markdown,
    error_text,
    pair_info_markdown,
    pair_markdown,
    plan_markdown,
    progress_html,
    progress_text,
)
from app.session import MODEL_CONCURRENCY, MODEL_GROUP, Session
from backend.api import Backend
from backend.config import LoadConfig, TreeConfig
from backend.errors import EagleChatError
from backend.events import Downloaded, Loaded, LoadFailed, Progress

logger = logging.getLogger(__name__)

CUSTOM = "custom (enter ids or folders)"
REMOTE = "Remote engine (vLLM, SGLang: any OpenAI-compatible URL)"
REMOTE_DEFAULT_URL = "http://127.0.0.1:8000"
REMOTE_HELP = (
    "**Remote engine**: enter the server's URL as the target (e.g. `http://127.0.0.1:8000`) "
    "and press **Load** to chat with it; leave the head empty, the server drafts with its own. "
    "Start one with `python launch.py serve --engine vllm --pair NAME`."
)
DTYPES = ["auto", "float32", "bfloat16", "float16"]
QUANTIZATIONS = [("none", "none"), ("int8 (CPU)", "int8"), ("8-bit", "8bit"), ("4-bit", "4bit")]
RECOMMENDED = " (recommended here)"
MAX_PROGRESS_LINES = 6
_TREE = TreeConfig()  # slider defaults come from backend/config.py, defined once there


@dataclass
class TreeControls:
    """Draft-tree settings; the chat and race tabs read them as event inputs."""

    auto: gr.Checkbox
    total_tokens: gr.Slider
    depth: gr.Slider
    top_k: gr.Slider

    @property
    def components(self) -> list[Any]:
        return [self.auto, self.total_tokens, self.depth, self.top_k]


def tree_config(auto: bool, total_tokens: float, depth: float, top_k: float) -> TreeConfig:
    """The TreeConfig for the UI values; "auto" lets the backend pick the shape per round."""
    if auto:
        return TreeConfig(auto=True)
    return TreeConfig(total_tokens=int(total_tokens), depth=int(depth), top_k=int(top_k))


@dataclass
class ModelsTab:
    notice: gr.Markdown
    pair: gr.Dropdown
    details: gr.Markdown
    target: gr.Textbox
    head: gr.Textbox
    dtype: gr.Dropdown
    quantization: gr.Radio
    tree: TreeControls
    plan_button: gr.Button
    plan: gr.Markdown
    download_button: gr.Button
    stop_download_button: gr.Button
    load_button: gr.Button
    unload_button: gr.Button
    reset_tuning_button: gr.Button
    progress: gr.HTML
    status: gr.Markdown


def quantization_choices(recommended: str) -> list[tuple[str, str]]:
    """The quantization radio's (label, value) pairs, the ``recommended`` one marked as such
    (int8 on a CPU: Backend.recommended_quantization)."""
    return [
        (label + (RECOMMENDED if value == recommended and value != "none" else ""), value)
        for label, value in QUANTIZATIONS
    ]


def build_models_tab(
    pairs: list[Any],
    initial: LoadConfig | None,
    selected: str | None,
    notice: str,
    recommended_quantization: str = "none",
) -> ModelsTab:
    """Render the manager; ``initial`` pre-fills the fields with the pair loaded at start and
    ``selected`` names its catalog entry (PairSpec objects from ``Backend.catalog()``)."""
    chosen = next((pair for pair in pairs if pair.name == selected), None)
    notice_md = gr.Markdown(notice, visible=bool(notice), elem_id="models-notice")
    with gr.Row():
        with gr.Column(scale=3):
            pair = gr.Dropdown(
                choices=[*(pair.name for pair in pairs), CUSTOM, REMOTE],
                value=chosen.name if chosen else (REMOTE if selected == REMOTE else CUSTOM),
                label="Catalog pair",
                elem_id="models-pair",
            )
            shown = pair_markdown(chosen) if chosen else (REMOTE_HELP if selected == REMOTE else "")
            details = gr.Markdown(shown, elem_id="models-details")
            target = gr.Textbox(
                label="Target model (Hub id org/name or local folder)",
                value=initial.target if initial else "",
                elem_id="models-target",
            )
            head = gr.Textbox(
                label="EAGLE head (Hub id or folder; empty = drafts from the context only)",
                value=(initial.head or "") if initial else "",
                elem_id="models-head",
            )
            with gr.Row():
                dtype = gr.Dropdown(
                    DTYPES, value=initial.dtype if initial else "auto", label="dtype"
                )
                quantization = gr.Radio(
                    quantization_choices(recommended_quantization),
                    value=initial.quantization if initial else "none",
                    label="Quantization of the target",
                    info="int8: fast on CPUs and exact (EAGLE = vanilla of the int8 model); "
                    "8-bit / 4-bit: bitsandbytes, for GPUs",
                    elem_id="models-quantization",
                )
        with gr.Column(scale=2):
            gr.Markdown("#### Draft tree")
            auto = gr.Checkbox(
                value=True,
                label="auto: pick the tree per round from measured speed and acceptance",
            )
            total_tokens = gr.Slider(
                2,
                128,
                value=_TREE.total_tokens,
                step=1,
                label="total tokens verified per round (root included)",
            )
            depth = gr.Slider(1, 12, value=_TREE.depth, step=1, label="depth (draft steps)")
            top_k = gr.Slider(1, 16, value=_TREE.top_k, step=1, label="top-k per expansion")
            reset_tuning_button = gr.Button(
                "Forget what auto learned of this pair", size="sm", elem_id="models-reset-tuning"
            )
    with gr.Row():
        plan_button = gr.Button("Check size & memory", elem_id="models-plan-btn")
        download_button = gr.Button("Download", elem_id="models-download-btn")
        stop_download_button = gr.Button("Stop download", variant="stop")
        load_button = gr.Button("Load", variant="primary", elem_id="models-load-btn")
        unload_button = gr.Button("Unload", elem_id="models-unload-btn")
    plan = gr.Markdown(label="Plan", elem_id="models-plan")
    progress = gr.HTML(elem_id="models-progress")  # a native <progress> bar, see render.py
    status = gr.Markdown(label="Status", elem_id="models-status")
    return ModelsTab(
        notice=notice_md,
        pair=pair,
        details=details,
        target=target,
        head=head,
        dtype=dtype,
        quantization=quantization,
        tree=TreeControls(auto, total_tokens, depth, top_k),
        plan_button=plan_button,
        plan=plan,
        download_button=download_button,
        stop_download_button=stop_download_button,
        load_button=load_button,
        unload_button=unload_button,
        reset_tuning_button=reset_tuning_button,
        progress=progress,
        status=status,
    )


class ModelsController:
    """Handlers of the manager: UI values in, Markdown out; errors become clear messages."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def _catalog(self) -> dict[str, Any]:
        try:
            return {pair.name: pair for pair in self.backend.catalog()}
        except EagleChatError as err:
            logger.warning("catalog unreadable: %s", err)
            return {}

    def select_pair(self, name: str) -> tuple[Any, ...]:
        """Fill target, head, dtype and the recommended tree from a catalog entry."""
        pair = self._catalog().get(name)
        if name == REMOTE:
            return (REMOTE_DEFAULT_URL, "", *(gr.skip(),) * 4, REMOTE_HELP)
        if pair is None:
            hint = "Enter a target and a head: Hub repo ids (`org/name`) or local folders."
            return (gr.skip(),) * 6 + (hint,)
        tree = pair.tree
        return (
            pair.target,
            pair.head,
            self.backend.default_dtype(pair.dtype),  # the catalog's bf16 is for GPUs, not CPUs
            tree.total_tokens,
            tree.depth,
            tree.top_k,
            pair_markdown(pair),
        )

    def check_plan(self, target: str, head: str, dtype: str, quantization: str) -> str:
        target, head_or_none = _clean(target), _clean(head) or None
        if not target:
            return error_markdown(LoadFailed("config", "enter a target model first"))
        if is_remote(target):
            return "Remote engine: nothing to download here. Press **Load** to connect."
        try:
            return plan_markdown(self.backend.plan(target, head_or_none, dtype, quantization))
        except EagleChatError as err:
            return error_markdown(LoadFailed(err.code, err.message, err.hint))

    def download(self, target: str, head: str, session: Session) -> Iterator[tuple[str, str]]:
        """Fetch what is missing; yields (progress bar, status) as bytes arrive."""
        target, head_or_none = _clean(target), _clean(head) or None
        if not target:
            raise gr.Error("Enter a target model first.")
        run = session.start("download")
        lines: list[str] = []
        for event in self.backend.download(target, head_or_none, cancel=run.cancel):
            if isinstance(event, Progress):
                _remember(event, lines)
                yield progress_html(event), _progress_markdown("Downloading…", lines)
            elif isinstance(event, Downloaded):
                where = f"`{event.target_path}`" + (
                    f" and `{event.head_path}`" if event.head_path else ""
                )
                done = Progress("download", 1, 1, "steps", "complete")
                yield progress_html(done), f"✓ Downloaded: {where}. Press **Load** to use it."
            elif isinstance(event, LoadFailed):
                gr.Warning(error_text(event))
                yield "", error_markdown(event)

    def stop_download(self, session: Session) -> None:
        session.stop("download")

    def load(
        self, target: str, head: str, dtype: str, quantization: str
    ) -> Iterator[tuple[str, str, str]]:
        """Load (downloading what is missing); yields (progress bar, status, header).
        A URL as the target connects to that remote engine instead."""
        if is_remote(target):
            yield from self._connect(_clean(target))
            return
        try:
            config = LoadConfig(
                target=_clean(target),
                head=_clean(head) or None,
                dtype=dtype,  # type: ignore[arg-type]
                quantization=quantization,  # type: ignore[arg-type]
            )
        except EagleChatError as err:
            raise gr.Error(error_text(LoadFailed(err.code, err.message, err.hint))) from err
        started = time.perf_counter()
        lines: list[str] = []
        for event in self.backend.load(config):
            if isinstance(event, Progress):
                _remember(event, lines)
                status = _progress_markdown(f"Loading `{config.target}`…", lines)
                yield progress_html(event), status, gr.skip()
            elif isinstance(event, Loaded):
                seconds = time.perf_counter() - started
                done = Progress("load", 1, 1, "steps", "ready")
                status = f"✓ Loaded in {seconds:.1f} s.\n\n{pair_info_markdown(event.info)}"
                yield progress_html(done), status, self.header()
            elif isinstance(event, LoadFailed):
                gr.Warning(error_text(event))
                yield "", error_markdown(event), self.header()

    def _connect(self, url: str) -> Iterator[tuple[str, str, str]]:
        for event in self.backend.connect_remote(url):
            if isinstance(event, Progress):
                yield progress_html(event), f"Connecting to {url}…", gr.skip()
            elif isinstance(event, Loaded):
                done = Progress("load", 1, 1, "steps", "connected")
                yield progress_html(done), f"✓ Connected.\n\n{self.header()}", self.header()
            elif isinstance(event, LoadFailed):
                gr.Warning(error_text(event))
                yield "", error_markdown(event), self.header()

    def unload(self) -> tuple[str, str, str]:
        self.backend.unload()
        return "", "Unloaded: no model in memory.", self.header()

    def reset_tuning(self) -> tuple[str, str]:
        """(status, header): the auto tree starts again from its prior, here and next launch."""
        try:
            self.backend.reset_tuning()
        except EagleChatError as err:
            return error_markdown(LoadFailed(err.code, err.message, err.hint)), self.header()
        except OSError as err:
            return f"**Could not delete the saved tuning state:** {err}", self.header()
        message = (
            "✓ The tree tuner forgot what it learned of this pair: the next reply learns the "
            "head's acceptance and this machine's round times from scratch."
        )
        return message, self.header()

    def header(self) -> str:
        return pair_info_markdown(self.backend.status().loaded)

    def refresh(self) -> tuple[str, str]:
        """Status and header on page load (the model may have changed in another tab)."""
        loaded = self.backend.status().loaded
        return (pair_info_markdown(loaded) if loaded else "", self.header())


def is_remote(target: str | None) -> bool:
    """A target written as an http(s) URL names a remote engine, not a model."""
    return _clean(target).startswith(("http://", "https://"))


def _clean(value: str | None) -> str:
    return (value or "").strip()


def _remember(event: Progress, lines: list[str]) -> None:
    """Keep the last few progress lines for the status; byte counts update in place."""
    line = progress_text(event)
    if lines and event.unit == "bytes" and lines[-1].split(":")[0] == line.split(":")[0]:
        lines[-1] = line
    else:
        lines.append(line)
    del lines[:-MAX_PROGRESS_LINES]


def _progress_markdown(title: str, lines: list[str]) -> str:
    return f"**{title}**\n\n" + "\n".join(f"- {line}" for line in lines)


def _wire_hub_events(tab: ModelsTab, controller: ModelsController, session: gr.State) -> Any:
    """Pair choice, memory plan and downloads (the Hub's concurrency group); returns the
    download event so that a finished download refreshes the plan."""
    selected = tab.pair.change(
        controller.select_pair,
        inputs=[tab.pair],
        outputs=[
            tab.target,
            tab.head,
            tab.dtype,
            tab.tree.total_tokens,
            tab.tree.depth,
            tab.tree.top_k,
            tab.details,
        ],
        api_name="select_pair",
        concurrency_limit=None,
        queue=False,
    )
    location = [tab.target, tab.head, tab.dtype, tab.quantization]
    selected.then(  # a picked pair shows its sizes and memory right away
        controller.check_plan,
        inputs=location,
        outputs=[tab.plan],
        api_visibility="private",
        concurrency_id="hub",
        concurrency_limit=2,
    )
    tab.plan_button.click(
        controller.check_plan,
        inputs=location,
        outputs=[tab.plan],
        api_name="plan",
        concurrency_id="hub",
        concurrency_limit=2,
    )
    download = tab.download_button.click(
        controller.download,
        inputs=[tab.target, tab.head, session],
        outputs=[tab.progress, tab.status],
        api_name="download",
        show_progress="hidden",
        concurrency_id="hub",
        concurrency_limit=2,
    )
    tab.stop_download_button.click(
        controller.stop_download,
        inputs=[session],
        outputs=None,
        api_name="stop_download",
        concurrency_limit=None,
        queue=False,
    )
    return download


def wire_models_tab(
    tab: ModelsTab, backend: Backend, session: gr.State, header: gr.Markdown
) -> ModelsController:
    """Connect the manager's buttons; loading shares the model's concurrency group."""
    controller = ModelsController(backend)
    download = _wire_hub_events(tab, controller, session)
    location = [tab.target, tab.head, tab.dtype, tab.quantization]
    tab.load_button.click(
        controller.load,
        inputs=location,
        outputs=[tab.progress, tab.status, header],
        api_name="load",
        show_progress="hidden",
        concurrency_id=MODEL_GROUP,
        concurrency_limit=MODEL_CONCURRENCY,
    )
    download.then(
        controller.check_plan, inputs=location, outputs=[tab.plan], api_visibility="private"
    )
    tab.unload_button.click(
        controller.unload,
        outputs=[tab.progress, tab.status, header],
        api_name="unload",
        concurrency_id=MODEL_GROUP,
        concurrency_limit=MODEL_CONCURRENCY,
    )
    tab.reset_tuning_button.click(
        controller.reset_tuning,
        outputs=[tab.status, header],
        api_name="reset_tuning",
        concurrency_id=MODEL_GROUP,
        concurrency_limit=MODEL_CONCURRENCY,
    )
    return controller
