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

from backend.bench.prompts import BenchPrompt
from backend.bench.report import MethodSummary, label, summarize, write_reports
from backend.bench.runner import BenchResult
from backend.errors import InputError

DEFAULT_FILLER = Path(__file__).resolve().parents[2] / "README.md"


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
        method: {"tokens_per_s": s.tokens_per_s, "speedup": s.speedup, "tau": s.tau}
        for method, s in point.summaries.items()
    }
    return {
        "prompt_tokens": point.prompt_tokens,
        "measured_tokens": point.measured_tokens,
    } | methods


def sweep_markdown(points: list[SweepPoint], command: str) -> str:
    lines = [
        f"Command: `{command}`",
        "",
        "| prompt tokens | vanilla tok/s | EAGLE tok/s | speedup | tau | identical |",
        "|---|---|---|---|---|---|",
    ]
    for point in points:
        vanilla, eagle = point.summaries["vanilla"], point.summaries["eagle"]
        tau = f"{eagle.tau:.2f}" if eagle.tau is not None else "-"
        lines.append(
            f"| {point.measured_tokens:.0f} | {vanilla.tokens_per_s:.1f} | "
            f"{eagle.tokens_per_s:.1f} | {eagle.speedup:.2f}x | {tau} | {eagle.identical}/{point.prompts} |"
        )
    if len(points) > 1:
        first, last = points[0].summaries["eagle"], points[-1].summaries["eagle"]
        lines += [
            "",
            f"{label('eagle')} at {points[-1].measured_tokens:.0f} prompt tokens keeps "
            f"{last.speedup / first.speedup:.0%} of its speedup at "
            f"{points[0].measured_tokens:.0f} (tau {_tau(last)} against {_tau(first)}).",
        ]
    return "\n".join(lines) + "\n"


def _tau(summary: MethodSummary) -> str:
    return f"{summary.tau:.2f}" if summary.tau is not None else "-"
