"""EAGLE versus vanilla: one prompt through both decoders of the loaded target, side by side.

Both lanes stream live with their own tokens/s (the backend times each lane by its own
compute, so interleaving them on one device is fair); the end shows the speedup and, at
temperature 0, whether the two texts are identical or where they first differ.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import gradio as gr

from app.chat_tab import generation_config
from app.models_tab import TreeControls
from app.render import (
    EMPTY_RACE_PLOT,
    LANE_COLORS,
    SPAN_COLORS,
    LiveStats,
    error_markdown,
    error_text,
    highlight_spans,
    lane_markdown,
    race_frame,
    race_has_data,
    race_verdict_markdown,
)
from app.session import MODEL_CONCURRENCY, MODEL_GROUP, Baseline, Session
from app.stats_panel import MIN_REFRESH_S, PLOT_REFRESH_S, Pacer, plot_values
from backend.api import Backend
from backend.config import DEFAULT_MAX_NEW_TOKENS
from backend.events import GenerationFailed, RaceFinished, RaceUpdate

logger = logging.getLogger(__name__)

DEFAULT_PROMPT = "Explain in a few sentences why the sky is blue."


def race_values(
    vanilla: LiveStats, eagle: LiveStats, verdict: str, with_plot: bool = True
) -> tuple[Any, ...]:
    """Outputs in order: vanilla text, vanilla numbers, EAGLE text, EAGLE numbers, verdict,
    tokens-over-time plot and its empty-state line (both left as they are when ``with_plot``
    is False)."""
    plot = (
        plot_values(race_frame(vanilla, eagle), race_has_data(vanilla, eagle))
        if with_plot
        else (gr.skip(),) * 2
    )
    return (
        highlight_spans(vanilla.spans),
        lane_markdown(vanilla, "vanilla"),
        highlight_spans(eagle.spans),
        lane_markdown(eagle, "EAGLE"),
        verdict,
        *plot,
    )


class RaceController:
    def __init__(
        self,
        backend: Backend,
        min_refresh_s: float = MIN_REFRESH_S,
        plot_refresh_s: float = PLOT_REFRESH_S,
    ) -> None:
        self.backend = backend
        self.min_refresh_s = min_refresh_s  # tests pass 0 to see every round
        self.plot_refresh_s = plot_refresh_s

    def race(
        self,
        prompt: str,
        system_prompt: str,
        temperature: float,
        top_p: float,
        max_new_tokens: float,
        tree_auto: bool,
        total_tokens: float,
        depth: float,
        top_k: float,
        session: Session,
    ) -> Iterator[tuple[Any, ...]]:
        text = (prompt or "").strip()
        if not text:
            raise gr.Error("Type a prompt first.")
        tree = (tree_auto, total_tokens, depth, top_k)
        config = generation_config("eagle", temperature, top_p, max_new_tokens, tree)
        run = session.start("race")
        lanes = {"vanilla": LiveStats(), "eagle": LiveStats()}
        busy = self.backend.status().busy
        verdict = "Waiting for the model: another request is running…" if busy else "Racing…"
        yield race_values(lanes["vanilla"], lanes["eagle"], verdict)
        events = self.backend.race(
            [{"role": "user", "content": text}],
            config,
            system_prompt=(system_prompt or "").strip() or None,
            cancel=run.cancel,
        )
        pacer, plot_pacer = Pacer(self.min_refresh_s), Pacer(self.plot_refresh_s)
        for event in events:
            final = isinstance(event, (RaceFinished, GenerationFailed))
            if isinstance(event, RaceUpdate):
                lanes[event.lane].update(event.event)
                verdict = "Racing…" if verdict.startswith("Waiting") else verdict
            elif isinstance(event, RaceFinished):
                info = self.backend.status().loaded
                dtype = info.dtype if info is not None else "float32"
                verdict = race_verdict_markdown(event, float(temperature), dtype)
                self._remember_baseline(lanes["vanilla"], session)
            elif isinstance(event, GenerationFailed):
                gr.Warning(error_text(event))
                verdict = error_markdown(event)
            if pacer.due(final=final):
                with_plot = plot_pacer.due(final=final)
                yield race_values(lanes["vanilla"], lanes["eagle"], verdict, with_plot)

    def stop(self, session: Session) -> None:
        session.stop("race")

    def _remember_baseline(self, vanilla: LiveStats, session: Session) -> None:
        """The race measured vanilla decoding: the chat panel's speedup uses it from now on
        instead of the calibration's estimate."""
        info, speed = self.backend.status().loaded, vanilla.decode_tokens_per_s
        if info is not None and speed:
            session.baseline = Baseline(info=info, tokens_per_s=speed)


@dataclass
class RaceTab:
    prompt: gr.Textbox
    system_prompt: gr.Textbox
    temperature: gr.Slider
    top_p: gr.Slider
    max_new_tokens: gr.Slider
    run: gr.Button
    stop: gr.Button
    vanilla_text: gr.HighlightedText
    vanilla_stats: gr.Markdown
    eagle_text: gr.HighlightedText
    eagle_stats: gr.Markdown
    verdict: gr.Markdown
    plot: gr.LinePlot
    plot_empty: gr.Markdown

    @property
    def outputs(self) -> list[Any]:
        return [
            self.vanilla_text,
            self.vanilla_stats,
            self.eagle_text,
            self.eagle_stats,
            self.verdict,
            self.plot,
            self.plot_empty,
        ]


def build_race_tab() -> RaceTab:
    with gr.Row():
        prompt = gr.Textbox(DEFAULT_PROMPT, label="Prompt", lines=2, scale=5, elem_id="race-prompt")
        with gr.Column(scale=1, min_width=160):
            run = gr.Button("Race", variant="primary", elem_id="race-run")
            stop = gr.Button("Stop", variant="stop", elem_id="race-stop")
    with gr.Accordion("Settings", open=False):
        system_prompt = gr.Textbox("", label="System prompt", lines=1)
        with gr.Row():
            temperature = gr.Slider(
                0.0,
                2.0,
                value=0.0,
                step=0.05,
                label="temperature (0 = greedy: outputs must be identical)",
            )
            top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="top-p")
            max_new_tokens = gr.Slider(
                1,
                2048,
                value=DEFAULT_MAX_NEW_TOKENS,
                step=1,
                label="max new tokens",
                elem_id="race-max-new-tokens",
            )
    with gr.Row(equal_height=False):
        with gr.Column():
            vanilla_stats = gr.Markdown(
                "**vanilla**", label="Vanilla stats", elem_id="race-vanilla-stats"
            )
            vanilla_text = gr.HighlightedText(
                label="Vanilla decoding (one token per forward)",
                color_map=SPAN_COLORS,
                show_inline_category=False,
                elem_id="race-vanilla-text",
            )
        with gr.Column():
            eagle_stats = gr.Markdown("**EAGLE**", label="EAGLE stats", elem_id="race-eagle-stats")
            eagle_text = gr.HighlightedText(
                label="EAGLE (green: accepted drafts)",
                color_map=SPAN_COLORS,
                show_legend=True,
                show_inline_category=False,
                elem_id="race-eagle-text",
            )
    with gr.Row(equal_height=False):
        verdict = gr.Markdown(label="Verdict", elem_id="race-verdict")
        plot_empty = gr.Markdown(EMPTY_RACE_PLOT, elem_id="race-plot-empty")
        plot = gr.LinePlot(
            race_frame(LiveStats(), LiveStats()),
            x="seconds",
            y="tokens",
            color="lane",
            color_map=LANE_COLORS,
            title="Tokens generated over each lane's compute time",
            height=240,
            elem_id="race-plot",
            visible=False,
        )
    return RaceTab(
        prompt=prompt,
        system_prompt=system_prompt,
        temperature=temperature,
        top_p=top_p,
        max_new_tokens=max_new_tokens,
        run=run,
        stop=stop,
        vanilla_text=vanilla_text,
        vanilla_stats=vanilla_stats,
        eagle_text=eagle_text,
        eagle_stats=eagle_stats,
        verdict=verdict,
        plot=plot,
        plot_empty=plot_empty,
    )


def wire_race_tab(
    tab: RaceTab, backend: Backend, session: gr.State, tree: TreeControls
) -> RaceController:
    controller = RaceController(backend)
    gr.on(
        [tab.run.click, tab.prompt.submit],
        controller.race,
        inputs=[
            tab.prompt,
            tab.system_prompt,
            tab.temperature,
            tab.top_p,
            tab.max_new_tokens,
            *tree.components,
            session,
        ],
        outputs=tab.outputs,
        api_name="race",
        concurrency_id=MODEL_GROUP,
        concurrency_limit=MODEL_CONCURRENCY,
        show_progress="minimal",
    )
    tab.stop.click(
        controller.stop,
        inputs=[session],
        outputs=None,
        api_name="race_stop",
        concurrency_limit=None,
        queue=False,
    )
    return controller
