"""The live acceptance panel: coloured reply tokens, the numbers and a per-round plot.

One component group, built by the chat tab (and reusable by any tab that streams a
generation); :func:`panel_values` turns a :class:`~app.render.LiveStats` into its three values
in the order of :attr:`StatsPanel.outputs`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from app.render import (
    SPAN_COLORS,
    LiveStats,
    acceptance_frame,
    highlight_spans,
    stats_markdown,
)


@dataclass
class StatsPanel:
    tokens: gr.HighlightedText
    numbers: gr.Markdown
    plot: gr.LinePlot

    @property
    def outputs(self) -> list[Any]:
        return [self.tokens, self.numbers, self.plot]


def build_stats_panel() -> StatsPanel:
    """Render the panel into the current Blocks context."""
    tokens = gr.HighlightedText(
        label="Reply tokens by source",
        color_map=SPAN_COLORS,
        show_legend=True,
        show_inline_category=False,
        elem_id="accept-tokens",
        elem_classes=["accept-tokens"],
    )
    numbers = gr.Markdown(
        stats_markdown(LiveStats()), label="Acceptance stats", elem_id="accept-stats"
    )
    plot = gr.LinePlot(
        acceptance_frame(LiveStats()),
        x="round",
        y="acceptance length",
        title="Acceptance length per round",
        height=220,
        label="Acceptance plot",
        elem_id="accept-plot",
    )
    return StatsPanel(tokens=tokens, numbers=numbers, plot=plot)


def panel_values(
    stats: LiveStats, baseline_tps: float | None = None, mode: str = "eagle"
) -> tuple[list[tuple[str, str]], str, Any]:
    return (
        highlight_spans(stats.spans),
        stats_markdown(stats, baseline_tps=baseline_tps, mode=mode),
        acceptance_frame(stats),
    )
