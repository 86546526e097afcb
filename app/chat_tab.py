"""Chat tab: multi-turn streaming chat beside the live acceptance panel.

:class:`ChatController` holds the handlers as plain methods (UI values in, component values
out) so tests drive them with a fake backend; :func:`build_chat_tab` renders the components and
:func:`wire_chat_tab` connects them. Every model-using event shares the ``"model"`` concurrency
group; Stop and Clear run outside it so they reach a generation that is still streaming.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gradio as gr

from app.models_tab import TreeControls, tree_config
from app.render import LiveStats, error_markdown, error_text, message_text
from app.reply_format import reply_markdown
from app.session import MODEL_CONCURRENCY, MODEL_GROUP, Baseline, Session
from app.stats_panel import (
    MIN_REFRESH_S,
    PLOT_REFRESH_S,
    Pacer,
    StatsPanel,
    build_stats_panel,
    panel_values,
)
from backend.api import Backend
from backend.config import DEFAULT_MAX_NEW_TOKENS, GenerationConfig, SamplingConfig
from backend.errors import EagleChatError
from backend.events import GenerationFailed, Started

logger = logging.getLogger(__name__)

_SAMPLING = SamplingConfig()
ERROR_TITLE = "⚠ Error"  # metadata title of error notes, which are never sent to the model
BASELINE_HELP = (
    "Vanilla baseline: until it is measured here or by a race in *EAGLE vs vanilla*, the "
    "speedup above is an estimate."
)

ChatMessage = dict[str, Any]


def generation_config(
    mode: str,
    temperature: float,
    top_p: float,
    max_new_tokens: float,
    tree: tuple[bool, float, float, float],
) -> GenerationConfig:
    """UI values -> GenerationConfig; invalid settings become a gr.Error naming the value.
    ``tree`` holds the tree controls' values: auto, total tokens, depth, top-k."""
    try:
        return GenerationConfig(
            mode=mode,  # type: ignore[arg-type]
            max_new_tokens=int(max_new_tokens),
            sampling=SamplingConfig(temperature=float(temperature), top_p=float(top_p)),
            tree=tree_config(*tree),
        )
    except EagleChatError as err:
        raise gr.Error(f"{err.message} ({err.hint})" if err.hint else err.message) from err


def backend_messages(
    history: Sequence[ChatMessage], originals: Mapping[str, str] | None = None
) -> list[dict[str, str]]:
    """Chatbot history -> plain {role, content} messages; error notes are left out, and a
    reply shown as Markdown goes back to the model as the text it wrote (``originals``)."""
    messages = []
    for message in history:
        if (message.get("metadata") or {}).get("title") == ERROR_TITLE:
            continue
        content = message_text(message["content"])
        if message["role"] == "assistant" and originals:
            content = originals.get(content, content)
        messages.append({"role": message["role"], "content": content})
    return messages


class ChatController:
    """Chat handlers over one Backend; the per-session stop switch lives in the Session."""

    def __init__(
        self,
        backend: Backend,
        min_refresh_s: float = MIN_REFRESH_S,
        plot_refresh_s: float = PLOT_REFRESH_S,
    ) -> None:
        self.backend = backend
        self.min_refresh_s = min_refresh_s  # tests pass 0 to see every round
        self.plot_refresh_s = plot_refresh_s

    def chat(
        self,
        message: str,
        history: list[ChatMessage],
        system_prompt: str,
        mode: str,
        temperature: float,
        top_p: float,
        max_new_tokens: float,
        tree_auto: bool,
        total_tokens: float,
        depth: float,
        top_k: float,
        session: Session,
    ) -> Iterator[tuple[Any, ...]]:
        """Append the user's message and stream the reply with the live panel."""
        text = (message or "").strip()
        if not text:
            raise gr.Error("Type a message first.")
        tree = (tree_auto, total_tokens, depth, top_k)
        config = generation_config(mode, temperature, top_p, max_new_tokens, tree)
        history = [*(history or []), {"role": "user", "content": text}]
        yield from self._reply(history, system_prompt, config, session)

    def regenerate(
        self,
        history: list[ChatMessage],
        system_prompt: str,
        mode: str,
        temperature: float,
        top_p: float,
        max_new_tokens: float,
        tree_auto: bool,
        total_tokens: float,
        depth: float,
        top_k: float,
        session: Session,
    ) -> Iterator[tuple[Any, ...]]:
        """Drop the last reply (and any error note) and answer the last user message again."""
        history = list(history or [])
        while history and history[-1]["role"] != "user":
            history.pop()
        if not history:
            raise gr.Error("Nothing to regenerate yet.")
        tree = (tree_auto, total_tokens, depth, top_k)
        config = generation_config(mode, temperature, top_p, max_new_tokens, tree)
        yield from self._reply(history, system_prompt, config, session)

    def _reply(
        self,
        history: list[ChatMessage],
        system_prompt: str,
        config: GenerationConfig,
        session: Session,
    ) -> Iterator[tuple[Any, ...]]:
        """Outputs, in order: chatbot, message box, then the panel's three values."""
        run = session.start("chat")
        status = self.backend.status()
        baseline = session.baseline_for(status.loaded)
        stats = LiveStats(waiting=status.busy)
        yield [*history], "", *panel_values(stats, baseline, config.mode)
        events = self.backend.stream(
            backend_messages(history, session.replies),
            config,
            system_prompt=(system_prompt or "").strip() or None,
            cancel=run.cancel,
        )
        pacer, plot_pacer = Pacer(self.min_refresh_s), Pacer(self.plot_refresh_s)
        estimate: float | None = None
        for event in events:
            if run.discarded:  # cleared: leave the empty chat alone and free the model now
                events.close()
                return
            stats.update(event)
            if isinstance(event, Started) or not pacer.due(final=stats.done):
                continue
            shown = [*history]
            if stats.text or not stats.error:
                reply = reply_markdown(stats.text)
                shown.append({"role": "assistant", "content": reply})
                if stats.done:
                    session.remember_reply(reply, stats.text)
            if isinstance(event, GenerationFailed):
                gr.Warning(error_text(event))
                shown.append(
                    {
                        "role": "assistant",
                        "content": error_markdown(event),
                        "metadata": {"title": ERROR_TITLE},
                    }
                )
            with_plot = plot_pacer.due(final=stats.done)
            # Calibration happens in the first EAGLE reply: ask again until it is known.
            estimate = estimate or (None if baseline else self.backend.estimated_vanilla_speed())
            panel = panel_values(stats, baseline, config.mode, with_plot, estimate)
            yield shown, gr.skip(), *panel

    def stop(self, session: Session) -> None:
        if session.stop("chat"):
            logger.info("chat generation stopped by the user")

    def clear(self, session: Session) -> tuple[Any, ...]:
        session.stop("chat", discard=True)
        return [], "", *panel_values(LiveStats())

    def measure_baseline(self, session: Session) -> str:
        """Measure (once per loaded pair, in the backend) plain decoding speed of the target."""
        info = self.backend.status().loaded
        if info is None:
            raise gr.Error("Load a model first (Models tab).")
        speed = self.backend.vanilla_speed()
        if speed is None:
            return BASELINE_HELP
        session.baseline = Baseline(info=info, tokens_per_s=speed)
        return (
            f"Vanilla baseline: **{speed:.1f} tokens/s** (measured on `{info.target}`, "
            "plain greedy decoding, prefill excluded)."
        )


@dataclass
class ChatTab:
    chatbot: gr.Chatbot
    message: gr.Textbox
    send: gr.Button
    stop: gr.Button
    regenerate: gr.Button
    clear: gr.Button
    system_prompt: gr.Textbox
    mode: gr.Radio
    temperature: gr.Slider
    top_p: gr.Slider
    max_new_tokens: gr.Slider
    baseline_button: gr.Button
    baseline: gr.Markdown
    panel: StatsPanel


def build_chat_tab() -> ChatTab:
    with gr.Row(equal_height=False):
        with gr.Column(scale=3):
            chatbot = gr.Chatbot(
                label="Chat",
                height=520,
                buttons=["copy", "copy_all"],
                feedback_options=None,
                placeholder="Ask something. Green tokens in the panel were drafted by the head "
                "and accepted by the target.",
                elem_id="chatbot",
            )
            with gr.Row():
                message = gr.Textbox(
                    placeholder="Message (Enter to send, Shift+Enter for a new line)",
                    label="Message",
                    show_label=False,
                    lines=1,
                    max_lines=8,
                    scale=6,
                    elem_id="chat-input",
                )
                send = gr.Button("Send", variant="primary", scale=1, elem_id="chat-send")
            with gr.Row():
                stop = gr.Button("Stop", variant="stop", elem_id="chat-stop")
                regenerate = gr.Button("Regenerate", elem_id="chat-regenerate")
                clear = gr.Button("Clear", elem_id="chat-clear")
            with gr.Accordion("Generation settings", open=False, elem_id="chat-settings"):
                system_prompt = gr.Textbox("", label="System prompt", lines=2)
                mode = gr.Radio(
                    [("EAGLE", "eagle"), ("vanilla", "vanilla")], value="eagle", label="Decoding"
                )
                temperature = gr.Slider(
                    0.0,
                    2.0,
                    value=_SAMPLING.temperature,
                    step=0.05,
                    label="temperature (0 = greedy)",
                )
                top_p = gr.Slider(0.05, 1.0, value=_SAMPLING.top_p, step=0.05, label="top-p")
                max_new_tokens = gr.Slider(
                    1,
                    2048,
                    value=DEFAULT_MAX_NEW_TOKENS,
                    step=1,
                    label="max new tokens",
                    elem_id="chat-max-new-tokens",
                )
        with gr.Column(scale=2, elem_classes=["accept-panel"]):
            gr.Markdown("#### Live acceptance")
            panel = build_stats_panel()
            with gr.Row():
                baseline_button = gr.Button(
                    "Measure vanilla baseline", size="sm", elem_id="chat-baseline-btn"
                )
            baseline = gr.Markdown(BASELINE_HELP, label="Vanilla baseline", elem_id="chat-baseline")
    return ChatTab(
        chatbot=chatbot,
        message=message,
        send=send,
        stop=stop,
        regenerate=regenerate,
        clear=clear,
        system_prompt=system_prompt,
        mode=mode,
        temperature=temperature,
        top_p=top_p,
        max_new_tokens=max_new_tokens,
        baseline_button=baseline_button,
        baseline=baseline,
        panel=panel,
    )


def wire_chat_tab(
    tab: ChatTab, backend: Backend, session: gr.State, tree: TreeControls
) -> ChatController:
    controller = ChatController(backend)
    settings = [
        tab.system_prompt,
        tab.mode,
        tab.temperature,
        tab.top_p,
        tab.max_new_tokens,
        *tree.components,
        session,
    ]
    outputs = [tab.chatbot, tab.message, *tab.panel.outputs]
    gr.on(
        [tab.send.click, tab.message.submit],
        controller.chat,
        inputs=[tab.message, tab.chatbot, *settings],
        outputs=outputs,
        api_name="chat",
        concurrency_id=MODEL_GROUP,
        concurrency_limit=MODEL_CONCURRENCY,
        show_progress="minimal",
    )
    tab.regenerate.click(
        controller.regenerate,
        inputs=[tab.chatbot, *settings],
        outputs=outputs,
        api_name="regenerate",
        concurrency_id=MODEL_GROUP,
        concurrency_limit=MODEL_CONCURRENCY,
        show_progress="minimal",
    )
    tab.stop.click(
        controller.stop,
        inputs=[session],
        outputs=None,
        api_name="stop",
        concurrency_limit=None,
        queue=False,
    )
    gr.on(
        [tab.clear.click, tab.chatbot.clear],  # our button and the chatbot's own trash icon
        controller.clear,
        inputs=[session],
        outputs=outputs,
        api_name="clear",
        concurrency_limit=None,
        queue=False,
    )
    tab.baseline_button.click(
        controller.measure_baseline,
        inputs=[session],
        outputs=[tab.baseline],
        api_name="baseline",
        concurrency_id=MODEL_GROUP,
        concurrency_limit=MODEL_CONCURRENCY,
    )
    return controller
