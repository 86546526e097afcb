"""The live acceptance panel: coloured reply tokens, the numbers and a per-round plot.

One component group, built by the chat tab (and reusable by any tab that streams a
generation); :func:`panel_values` turns a :class:`~app.render.LiveStats` into its four values
in the order of :attr:`StatsPanel.outputs`. A plot without data stays hidden behind a line of
text (an empty Vega chart draws meaningless "0.000000" axis labels).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import gradio as gr
import pandas as pd

from app.render import (
    EMPTY_ACCEPTANCE_PLOT,
    SPAN_COLORS,
    LiveStats,
    acceptance_frame,
    highlight_spans,
    stats_markdown,
)

# Browsers fall behind when a tiny model on a CPU streams hundreds of rounds a second, and a
# plot redraw costs far more than a text update: text refreshes at most every MIN_REFRESH_S,
# plots every PLOT_REFRESH_S. Every round still lands in the numbers and the plot's data.
MIN_REFRESH_S = 0.05
PLOT_REFRESH_S = 0.5


@dataclass
class Pacer:
    """Says when a streaming handler should push the next UI update."""

    min_interval_s: float = MIN_REFRESH_S
    _last: float = field(default=float("-inf"), repr=False)

    def due(self, final: bool = False) -> bool:
        now = time.monotonic()
        if final or now - self._last >= self.min_interval_s:
            self._last = now
            return True
        return False


@dataclass
class StatsPanel:
    tokens: gr.HighlightedText
    numbers: gr.Markdown
    plot: gr.LinePlot
    plot_empty: gr.Markdown  # stands in for the plot until the first round

    @property
    def outputs(self) -> list[Any]:
        return [self.tokens, self.numbers, self.plot, self.plot_empty]


MIN_PLOT_ROUNDS = 10  # rounds the x axis spans at least: a shorter span gets ticks at halves


def plot_values(frame: pd.DataFrame, has_data: bool) -> tuple[Any, Any]:
    """(plot, empty-state line) updates: the plot shows only once it has data to draw."""
    rounds = [1, max(MIN_PLOT_ROUNDS, len(frame))]
    return gr.update(value=frame, visible=has_data, x_lim=rounds), gr.update(visible=not has_data)


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
        title="Tokens gained per round",
        caption="acceptance length: accepted drafts + 1",
        x_lim=[1, MIN_PLOT_ROUNDS],
        height=220,
        label="Acceptance plot",
        elem_id="accept-plot",
        visible=False,
    )
    plot_empty = gr.Markdown(EMPTY_ACCEPTANCE_PLOT, elem_id="accept-plot-empty")
    return StatsPanel(tokens=tokens, numbers=numbers, plot=plot, plot_empty=plot_empty)


def panel_values(
    stats: LiveStats,
    baseline_tps: float | None = None,
    mode: str = "eagle",
    with_plot: bool = True,
    estimated_tps: float | None = None,
) -> tuple[list[tuple[str, str]], str, Any, Any]:
    """Values for :attr:`StatsPanel.outputs`; ``with_plot=False`` leaves the plot as it is.
    ``estimated_tps`` (vanilla speed from calibration) is shown only while no baseline was
    measured, and marked as an estimate."""
    plot = plot_values(acceptance_frame(stats), stats.rounds > 0) if with_plot else (gr.skip(),) * 2
    return (
        highlight_spans(stats.spans),
        stats_markdown(stats, baseline_tps, mode, estimated_tps),
        *plot,
    )
