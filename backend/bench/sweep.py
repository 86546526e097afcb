"""Prompt-length sweep: the same prompts, lengthened to several context sizes by putting one
passage of text in front of each, benchmarked one length after another with one loaded pair.

A round of speculative decoding should cost no more, relative to a plain step, at a long context
than at a short one; the sweep shows whether it does (speedup and tau per length, and the
longest length's speedup as a share of the shortest's)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from backend.bench.prompt_sets import shared_root
from backend.bench.prompts import BenchPrompt
from backend.bench.report import MethodSummary, label, summarize, write_reports
from backend.bench.runner import BenchResult
from backend.errors import InputError

# a fixed public-domain book (L. F. Baum's The Wonderful Wizard of Oz) from the shared text
DEFAULT_FILLER = shared_root() / "data" / "wizard-of-oz" / "tinystories.txt"


@dataclass(frozen=True, slots=True)
class SweepPoint:
    prompt_tokens: int  # asked for
    measured_tokens: float  # mean prompt length after the chat format
    prompts: int  # prompt runs (prompts x seeds)
    summaries: dict[str, MethodSummary]


def lengthen(prompts: list[BenchPrompt], tokenizer, tokens: int, filler: str) -> list[BenchPrompt]:
    """Each prompt with the filler's first tokens in front, to about ``tokens`` tokens in all
    (the chat format adds a few)."""
    filler_ids = tokenizer(filler, add_special_tokens=False)["input_ids"]
    longer = []
    for prompt in prompts:
        room = tokens - len(tokenizer(prompt.text, add_special_tokens=False)["input_ids"])
        if room > len(filler_ids):
            raise InputError(
                f"the sweep text has {len(filler_ids)} tokens, fewer than the {room} needed "
                f"for {tokens}-token prompts",
                hint="pass a longer text with --sweep-text",
            )
        passage = tokenizer.decode(filler_ids[: max(0, room)]) if room > 0 else ""
        text = f"{passage}\n\n{prompt.text}" if passage else prompt.text
        longer.append(BenchPrompt(f"{prompt.question_id}@{tokens}", prompt.category, text))
    return longer


def run_sweep(
    lengths: list[int],
    bench: Callable[[list[BenchPrompt]], BenchResult],
    prompts: list[BenchPrompt],
    lengthen_to: Callable[[list[BenchPrompt], int], list[BenchPrompt]],
    out_dir: Path,
    command: str,
) -> list[SweepPoint]:
    """Bench each length (reports in ``out_dir/prompt-N``) and write sweep.md and sweep.json."""
    points = []
    for tokens in sorted(lengths):
        result = bench(lengthen_to(prompts, tokens))
        write_reports(result, out_dir / f"prompt-{tokens}", command)
        measured = float(result.settings.get("prompt_tokens_mean", tokens))
        points.append(SweepPoint(tokens, measured, len(result.prompts), summarize(result)))
    (out_dir / "sweep.md").write_text(sweep_markdown(points, command))
    rows = [_as_row(point) for point in points]
    (out_dir / "sweep.json").write_text(json.dumps(rows, indent=2))
    return points


def _as_row(point: SweepPoint) -> dict:
    methods = {
        method: {
            "tokens_per_s": s.tokens_per_s,
            "speedup": s.speedup,
            "decode_speedup": s.decode_speedup,
            "tau": s.tau,
        }
        for method, s in point.summaries.items()
    }
    return {
        "prompt_tokens": point.prompt_tokens,
        "measured_tokens": point.measured_tokens,
    } | methods


def sweep_markdown(points: list[SweepPoint], command: str) -> str:
    """One row per length for the EAGLE row; then, for it and every fixed tree, the share of
    its short-prompt speedup kept at the longest prompt, end to end and decoding alone."""
    lines = [
        f"Command: `{command}`",
        "",
        "Speedup counts the whole reply, prefill included; decode speedup leaves the prefill "
        "(the same work for both, and most of the time at long prompts) out of both sides.",
        "",
        "| prompt tokens | vanilla tok/s | EAGLE tok/s | speedup | decode speedup | tau | identical |",
        "|---|---|---|---|---|---|---|",
    ]
    for point in points:
        vanilla, eagle = point.summaries["vanilla"], point.summaries["eagle"]
        lines.append(
            f"| {point.measured_tokens:.0f} | {vanilla.tokens_per_s:.1f} | "
            f"{eagle.tokens_per_s:.1f} | {eagle.speedup:.2f}x | {_times(eagle.decode_speedup)} | "
            f"{_tau(eagle)} | {eagle.identical}/{point.prompts} |"
        )
    if len(points) > 1:
        lines += ["", *_retention_lines(points[0], points[-1])]
    return "\n".join(lines) + "\n"


def _retention_lines(short: SweepPoint, long: SweepPoint) -> list[str]:
    lines = [
        f"| method | speedup kept at {long.measured_tokens:.0f} vs {short.measured_tokens:.0f} "
        "tokens | decode speedup kept | tau (short / long) |",
        "|---|---|---|---|",
    ]
    for method, first in short.summaries.items():
        last = long.summaries.get(method)
        if last is None or first.tau is None or method == "vanilla":
            continue
        decode = (
            f"{last.decode_speedup / first.decode_speedup:.0%}"
            if first.decode_speedup and last.decode_speedup
            else "-"
        )
        lines.append(
            f"| {label(method)} | {last.speedup / first.speedup:.0%} | {decode} | "
            f"{_tau(first)} / {_tau(last)} |"
        )
    return lines


def _times(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "-"


def _tau(summary: MethodSummary) -> str:
    return f"{summary.tau:.2f}" if summary.tau is not None else "-"
