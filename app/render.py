"""Pure functions from backend events to component values (no Gradio, no model).

Everything the UI shows about a generation is computed here, so it can be unit-tested on
hand-made events: the coloured spans of the live panel, the stats table, the plot frames, the
race verdict and the error lines. Definitions (accepted drafts, acceptance length, tau) are the
ones in ``backend/events.py``; this module only displays them.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from backend.events import (
    EngineMetrics,
    Finished,
    GenerationFailed,
    GenerationSummary,
    LoadFailed,
    PairInfo,
    PairPlan,
    Progress,
    RaceFinished,
    RoundCompleted,
    Started,
    TextSpan,
    average_acceptance_length,
    first_divergence,
    format_bytes,
)

HEAD_LABEL = "head draft"
CONTEXT_LABEL = "context draft"
TARGET_LABEL = "target"
SOURCE_LABELS = {"head": HEAD_LABEL, "context": CONTEXT_LABEL, "target": TARGET_LABEL}
# Green for tokens the head guessed right, amber for tokens copied from the context, a quiet
# blue-grey for the target's own tokens.
SPAN_COLORS = {HEAD_LABEL: "#34d399", CONTEXT_LABEL: "#fbbf24", TARGET_LABEL: "#cbd5e1"}
LANE_COLORS = {"vanilla": "#94a3b8", "EAGLE": "#10b981"}

STOP_REASONS = {
    "eos": "end of reply",
    "max_new_tokens": "max new tokens reached",
    "context_length": "context full",
    "stop_string": "end of turn (turn marker)",
    "cancelled": "stopped",
}

Highlight = tuple[str, str]

# Shown instead of a plot that has nothing to draw yet.
EMPTY_ACCEPTANCE_PLOT = (
    "*No rounds yet: acceptance length per round is plotted here as a reply streams.*"
)
EMPTY_RACE_PLOT = (
    "*No race yet: tokens over time for both lanes are plotted here once a race runs.*"
)


def highlight_spans(spans: Iterable[TextSpan]) -> list[Highlight]:
    """(text, label) pairs for gr.HighlightedText, adjacent pieces of one source merged."""
    merged: list[Highlight] = []
    for span in spans:
        if not span.text:
            continue
        label = SOURCE_LABELS[span.source]
        if merged and merged[-1][1] == label:
            merged[-1] = (merged[-1][0] + span.text, label)
        else:
            merged.append((span.text, label))
    return merged


@dataclass
class LiveStats:
    """Running view of one generation stream, folded event by event (see :meth:`update`)."""

    spans: list[TextSpan] = field(default_factory=list)
    new_tokens: int = 0
    verify_tokens: int = 0  # tokens produced by verification rounds (the prefill token excluded)
    acceptance_lengths: list[int] = field(default_factory=list)  # tokens gained per round
    accepted_drafts: int = 0
    accepted_context: int = 0  # of those, copied from the context
    ttft_s: float | None = None
    # when the first verification round began: after the prefill and, for EAGLE, after the
    # head's pass over the prompt, which is prompt work, not decoding (the bench leaves it out)
    decode_start_s: float | None = None
    elapsed_s: float = 0.0
    progress: list[tuple[float, int]] = field(default_factory=list)  # (elapsed_s, new_tokens)
    summary: GenerationSummary | None = None
    error: GenerationFailed | None = None
    waiting: bool = False  # queued behind another job on the model
    remote: bool = False  # streamed by a remote engine: acceptance comes from its metrics
    engine: EngineMetrics | None = None

    def update(self, event: Any) -> None:
        self.waiting = False
        if isinstance(event, Started):
            return
        if isinstance(event, EngineMetrics):
            self.engine = event
        elif isinstance(event, RoundCompleted):
            self.spans.extend(event.spans)
            self.new_tokens += len(event.token_ids)
            self.elapsed_s = event.elapsed_s
            self.remote = self.remote or not event.rounds_known
            if event.round_index == 0:
                self.ttft_s = event.elapsed_s
            elif not event.rounds_known:
                pass  # a remote chunk: the engine's metrics count its draft rounds
            else:
                if self.decode_start_s is None:
                    parts = event.draft_s + event.verify_s + event.bookkeeping_s
                    self.decode_start_s = event.elapsed_s - parts
                self.verify_tokens += len(event.token_ids)
                self.accepted_drafts += event.num_accepted_drafts
                self.accepted_context += event.num_accepted_context
                self.acceptance_lengths.append(len(event.token_ids))
            self.progress.append((event.elapsed_s, self.new_tokens))
        elif isinstance(event, Finished):
            self.summary = event.summary
            self.elapsed_s = event.summary.total_s
            self.new_tokens = max(self.new_tokens, event.summary.new_tokens)
        elif isinstance(event, GenerationFailed):
            self.error = event

    @property
    def text(self) -> str:
        if self.summary is not None and self.summary.text:
            return self.summary.text
        return "".join(span.text for span in self.spans)

    @property
    def rounds(self) -> int:
        return len(self.acceptance_lengths)

    @property
    def tokens_per_s(self) -> float:
        if self.summary is not None:
            return self.summary.tokens_per_s
        return self.new_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens/s of the verification rounds, from the first one's start: the prefill and the
        head's pass over the prompt left out, as the bench's decode speed does."""
        start = self.decode_start_s
        if start is None or self.elapsed_s <= start or not self.verify_tokens:
            return None
        return self.verify_tokens / (self.elapsed_s - start)

    @property
    def tau(self) -> float | None:
        """Average acceptance length: verification tokens per round (events.py's tau)."""
        if self.summary is not None and self.summary.rounds:
            return self.summary.tau
        return average_acceptance_length(self.verify_tokens, self.rounds) if self.rounds else None

    @property
    def tokens_per_forward(self) -> float | None:
        """All new tokens over all target forwards, the prefill's included: what a user pays."""
        return self.new_tokens / (self.rounds + 1) if self.new_tokens else None

    @property
    def done(self) -> bool:
        return self.summary is not None or self.error is not None


def fold(events: Iterable[Any]) -> LiveStats:
    """A LiveStats fed every event of a finished stream (handy in tests and one-shot callers)."""
    stats = LiveStats()
    for event in events:
        stats.update(event)
    return stats


def _num(value: float | None, digits: int = 2, unit: str = "") -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value:.{digits}f}{unit}"


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.0%}" if whole else "–"


ESTIMATE_NOTE = (
    "*≈ Estimate: vanilla speed predicted from one plain step timed when the pair was "
    "calibrated, not measured. Press **Measure vanilla baseline** or run a race in "
    "**EAGLE vs vanilla** to measure it.*"
)


def stats_markdown(
    stats: LiveStats,
    baseline_tps: float | None = None,
    mode: str = "eagle",
    estimated_tps: float | None = None,
) -> str:
    """The live numbers as a two-column Markdown table, plus the speedup over vanilla: measured
    when a baseline was measured, else marked as an estimate from the calibration's
    ``estimated_tps``."""
    if stats.remote:
        return remote_stats_markdown(stats)
    last = stats.acceptance_lengths[-1] if stats.acceptance_lengths else None
    ttft = stats.ttft_s * 1000 if stats.ttft_s is not None else None
    rows = [
        ("tokens/s", _num(stats.tokens_per_s, 1)),
        ("time to first token", _num(ttft, 0, " ms")),
        ("avg acceptance length (τ)", _num(stats.tau)),
        ("last acceptance length", str(last) if last is not None else "–"),
        ("tokens per target forward", _num(stats.tokens_per_forward)),
        ("new tokens / rounds", f"{stats.new_tokens} / {stats.rounds}"),
        ("reply written by accepted drafts", _share(stats.accepted_drafts, stats.new_tokens)),
        (
            "drafts accepted: head / context",
            f"{stats.accepted_drafts - stats.accepted_context} / {stats.accepted_context}",
        ),
    ]
    decode = stats.decode_tokens_per_s
    note = ""
    if baseline_tps:
        speedup = decode / baseline_tps if decode else None
        rows.append(("vanilla baseline (measured)", f"{baseline_tps:.1f} tokens/s"))
        if mode == "eagle":
            rows.append(("decode speedup over baseline", _num(speedup, 2, "×")))
    elif estimated_tps and mode == "eagle":
        speedup = decode / estimated_tps if decode else None
        rows.append(("vanilla speed (estimate, not measured)", f"≈ {estimated_tps:.1f} tokens/s"))
        rows.append(("decode speedup (estimate)", f"≈ {_num(speedup, 2, '×')}"))
        note = ESTIMATE_NOTE
    lines = ["| metric | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]
    extra = [text for text in (note, _status_line(stats)) if text]
    return "\n\n".join(["\n".join(lines), *extra])


def remote_stats_markdown(stats: LiveStats) -> str:
    """The panel for a remote engine: tokens/s measured here, acceptance from its metrics."""
    ttft = stats.ttft_s * 1000 if stats.ttft_s is not None else None
    engine = stats.engine
    rate = engine.acceptance_rate if engine is not None else None
    per_position = " · ".join(
        f"{depth}: {share:.0%}"
        for depth, share in enumerate(engine.accepted_per_position if engine else (), 1)
    )
    rows = [
        ("tokens/s (measured here)", _num(stats.tokens_per_s, 1)),
        ("time to first token", _num(ttft, 0, " ms")),
        ("new tokens", str(stats.new_tokens)),
        (
            "acceptance rate (engine metrics)",
            _num(rate * 100 if rate is not None else None, 0, "%"),
        ),
        ("avg acceptance length (τ)", _num(stats.tau) if engine and engine.drafts else "–"),
        ("accepted per draft position", per_position or "–"),
        ("draft rounds / drafted / accepted", _engine_counts(engine)),
    ]
    lines = ["| metric | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]
    notes = [engine.message] if engine is not None and engine.message else []
    status = _status_line(stats)
    if status and not (stats.summary is not None and stats.summary.hint):
        notes.append(status)
    elif stats.summary is not None:
        reason = STOP_REASONS.get(stats.summary.stop_reason, stats.summary.stop_reason)
        notes.append(f"Finished ({reason}) in {stats.summary.total_s:.2f} s.")
    return "\n".join(lines) + "".join(f"\n\n{note}" for note in notes)


def _engine_counts(engine: EngineMetrics | None) -> str:
    if engine is None or engine.status != "ok":
        return "–"
    return f"{engine.drafts} / {engine.draft_tokens} / {engine.accepted_tokens}"


def _status_line(stats: LiveStats) -> str:
    if stats.error is not None:
        return error_markdown(stats.error)
    if stats.summary is not None:
        reason = STOP_REASONS.get(stats.summary.stop_reason, stats.summary.stop_reason)
        line = f"Finished ({reason}) in {stats.summary.total_s:.2f} s."
        hint = stats.summary.hint
        if hint:  # the engine's hint is a clause ("drafting took 37% ..."): make it a sentence
            line += f" Why not faster: {hint.rstrip('.')}."
        return line
    if stats.waiting:
        return "Waiting for the model: another request is running…"
    return "Generating…" if stats.new_tokens else ""


def acceptance_frame(stats: LiveStats) -> pd.DataFrame:
    """Acceptance length (tokens gained) per verification round, for a gr.LinePlot/BarPlot."""
    frame = pd.DataFrame(
        {
            "round": list(range(1, stats.rounds + 1)),
            "acceptance length": stats.acceptance_lengths,
        }
    )
    # Explicit dtypes: Gradio picks the axis type from the first (empty) value it sees.
    return frame.astype({"round": "int64", "acceptance length": "int64"})


def race_has_data(vanilla: LiveStats, eagle: LiveStats) -> bool:
    """Whether either lane has produced a token, i.e. the race plot has a line to draw."""
    return bool(vanilla.progress or eagle.progress)


def race_frame(vanilla: LiveStats, eagle: LiveStats) -> pd.DataFrame:
    """Tokens generated over time for both lanes, for one gr.LinePlot coloured by lane.

    Both lanes start at the origin, so the frame is never empty: a colour-split Gradio plot
    whose first value has no rows never draws its lines later."""
    rows = [("vanilla", 0.0, 0), *(("vanilla", t, n) for t, n in vanilla.progress)]
    rows += [("EAGLE", 0.0, 0), *(("EAGLE", t, n) for t, n in eagle.progress)]
    frame = pd.DataFrame(rows, columns=["lane", "seconds", "tokens"])
    return frame.astype({"lane": "str", "seconds": "float64", "tokens": "int64"})


def lane_markdown(stats: LiveStats, lane: str) -> str:
    """One race lane's headline: live tokens/s, tokens so far and its finish state."""
    head = f"**{lane}: {stats.tokens_per_s:.1f} tokens/s** · {stats.new_tokens} tokens"
    if lane == "EAGLE" and stats.tau is not None:
        head += f" · τ {stats.tau:.2f}"
    status = _status_line(stats)
    return head + (f"\n\n{status}" if status else "")


def _excerpt(text: str, at: int, before: int = 30, after: int = 20) -> str:
    start = max(0, at - before)
    piece = text[start:at] + "⟦" + text[at : at + after] + "⟧"
    return ("…" if start else "") + piece.replace("\n", "⏎").replace("`", "'")


ROUNDING_NOTE = (
    "In {dtype} this is expected, not a bug: verifying several tokens in one forward adds "
    "numbers in a different order than decoding one token at a time, the rounding differs, "
    "and where two candidate tokens are almost tied greedy decoding can pick the other one. "
    "Token-for-token identity is a float32 guarantee: load the pair in float32 to check it."
)


def race_verdict_markdown(
    result: RaceFinished, temperature: float = 0.0, dtype: str = "float32"
) -> str:
    """Final speedup and the identity verdict; where texts differ, where and how (and why,
    when sampling or half-precision rounding explains it)."""
    stopped = "cancelled" in (result.vanilla.stop_reason, result.eagle.stop_reason)
    lines = [
        f"### EAGLE speedup: {result.speedup:.2f}×" + (" (stopped early)" if stopped else ""),
        f"EAGLE {result.eagle.tokens_per_s:.1f} tokens/s vs vanilla "
        f"{result.vanilla.tokens_per_s:.1f} tokens/s, same target model.",
    ]
    if result.identical:
        lines.append(
            f"**Identical output** ✓ — both produced the same {result.eagle.new_tokens} tokens."
        )
    else:
        where = (
            f"first differ at token #{result.first_divergence}"
            if result.first_divergence is not None
            else "differ"
        )
        lines.append(f"**Outputs differ** ✗ — they {where}.")
        at = first_divergence(result.vanilla.text, result.eagle.text)
        if at is not None:
            lines.append(
                f"- vanilla: `{_excerpt(result.vanilla.text, at)}`\n"
                f"- EAGLE: `{_excerpt(result.eagle.text, at)}`"
            )
        if temperature == 0 and dtype != "float32":
            lines.append(ROUNDING_NOTE.format(dtype=dtype))
        if temperature > 0:
            lines.append(
                f"At temperature {temperature:g} both lanes sample independently, so the texts "
                "may differ while following the same distribution; identity is checked at "
                "temperature 0."
            )
    return "\n\n".join(lines)


def error_markdown(error: GenerationFailed | LoadFailed) -> str:
    """One clear line (and a hint) for a failed generation, download or load."""
    text = f"⚠ **{error.message}**"
    if error.hint:
        text += f" — {error.hint}"
    return text


def error_text(error: GenerationFailed | LoadFailed) -> str:
    """Plain text of an error, for toasts."""
    return f"{error.message} ({error.hint})" if error.hint else error.message


def progress_fraction(progress: Progress) -> float | None:
    if not progress.total:
        return None
    return max(0.0, min(1.0, progress.done / progress.total))


def progress_text(progress: Progress) -> str:
    """'download: 12.3 MB / 45.6 MB (27%) — message' style line."""
    if progress.unit == "bytes":
        amount = f"{format_bytes(progress.done)} / {format_bytes(progress.total)}"
    else:
        total = f"{progress.total:g}" if progress.total is not None else "?"
        amount = f"{progress.done:g} / {total} {progress.unit}"
    fraction = progress_fraction(progress)
    text = f"{progress.stage}: {amount}"
    if fraction is not None:
        text += f" ({fraction:.0%})"
    if progress.message:
        text += f" — {progress.message}"
    return text


def progress_html(progress: Progress) -> str:
    """A native <progress> bar with its line of text (indeterminate when the total is
    unknown); the only HTML the app writes, and every piece of text in it is escaped."""
    fraction = progress_fraction(progress)
    value = f' value="{fraction:.3f}" max="1"' if fraction is not None else ""
    label = html.escape(progress_text(progress))
    return (
        f'<div class="progress-line"><progress{value} aria-label="{label}"></progress>'
        f"<span>{label}</span></div>"
    )


def pair_info_markdown(info: PairInfo | None) -> str:
    """What is loaded, in one line a user can read at a glance."""
    if info is None:
        return "**No model loaded.** Pick a pair in the *Models* tab and press *Load*."
    if info.remote:
        return (
            f"**Remote engine:** `{info.target}` served by {info.architecture} at {info.remote} "
            "· speculation runs on the server; the panel reads its metrics"
        )
    head_dtype = f", drafting in {info.head_dtype}" if info.head_dtype else ""
    head = f"{info.head} ({info.head_kind}{head_dtype})" if info.head else "no head (vanilla only)"
    quant = "" if info.quantization == "none" else f", {info.quantization}"
    prompts = {
        "chat template": "",
        "plain completion": (
            " · **plain completion**: a base model without a chat template continues your text"
        ),
    }.get(info.prompt_format, f" · prompt format **{info.prompt_format}** (no chat template)")
    tuning = {
        "resumed": " · auto tuning resumes from what earlier runs of this pair learned",
        "new": " · auto tuning learns this pair from scratch",
    }.get(info.tree_tuning, "")
    return (
        f"**Loaded:** `{info.target}` + {head} · {info.architecture}, "
        f"{info.parameters / 1e6:.1f}M params, {info.dtype}{quant} on {info.device}{prompts}"
        f"{tuning}"
    )


def pair_markdown(pair: Any) -> str:
    """A catalog entry: kind, sizes, gating and the recommended tree."""
    tree = pair.tree
    lines = [
        f"**{pair.name}** — {pair.head_kind} head; "
        f"download ≈ {pair.target_gb + pair.head_gb:.2f} GB "
        f"(target {pair.target_gb:g} GB, head {pair.head_gb:g} GB)",
        f"Recommended tree: {tree.total_tokens} tokens, depth {tree.depth}, top-k {tree.top_k}; "
        + _catalog_dtype_text(pair.dtype),
    ]
    if pair.gated:
        lines.append("Gated target: accept its licence on the Hub and log in with a token first.")
    if pair.note:
        lines.append(pair.note)
    return "\n\n".join(lines)


def _catalog_dtype_text(dtype: str) -> str:
    if dtype == "float32":
        return "dtype float32."
    if dtype == "auto":
        return "dtype by device: float32 on CPUs, bfloat16 on GPUs."
    return f"dtype {dtype} on GPUs; float32 on CPUs without {dtype} matrix units."


def plan_markdown(plan: PairPlan) -> str:
    """Sizes, what is on disk already and the weights' memory estimate of a planned pair."""
    sides = [("target", plan.target)] + ([("head", plan.head)] if plan.head else [])
    lines = ["| | size | on disk | source |", "|---|---|---|---|"]
    for label, side in sides:
        source = "local folder" if side.source == "local" else "Hub"
        if side.source == "hub" and side.from_cache:
            source += " (from cache)"
        lines.append(
            f"| {label} | {format_bytes(side.total_bytes)} | "
            f"{format_bytes(side.cached_bytes)} | {source} |"
        )
    quant = "" if plan.quantization == "none" else f", {plan.quantization}"
    notes = [
        f"**To download:** {format_bytes(plan.bytes_to_download)}"
        + (" — everything is on disk, ready to load." if plan.ready else ""),
        f"**Memory for the weights:** ≈ {format_bytes(plan.memory_bytes)} "
        f"({plan.parameters / 1e6:,.1f}M target parameters in {plan.dtype}{quant} on "
        f"{plan.device}, plus the head)",
    ]
    if plan.parameters_source == "gguf":
        notes.append(
            "GGUF file: its quantized weights are dequantized to "
            f"{plan.dtype} when loaded, so they take more memory than the file's size."
        )
    if plan.kv_bytes_per_token:
        notes.append(
            f"KV cache on top: ≈ {format_bytes(plan.kv_bytes_per_token * 1000)} per 1000 tokens "
            "of context."
        )
    gated = [label for label, side in sides if side.gated]
    if gated:
        notes.append(
            f"Gated {' and '.join(gated)}: accept the licence on the Hub and log in "
            "(`hf auth login`) before downloading."
        )
    if plan.offline and not plan.ready:
        notes.append("Hub offline mode is on (HF_HUB_OFFLINE=1): missing files cannot be fetched.")
    return "\n".join(lines) + "\n\n" + "\n\n".join(notes)


def message_text(content: Any) -> str:
    """Text of a Gradio 6 chat message content (a string or a list of typed parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        return str(content.get("text", ""))
    if isinstance(content, Sequence):
        return "".join(message_text(part) for part in content)
    return ""
