"""Benchmark bookkeeping and reports: pure functions of a BenchResult (JSON, Markdown, PNG).

Definitions: tokens/s of a method = all its new tokens / all its generation seconds; speedup =
EAGLE tokens/s / vanilla tokens/s from the same run; tau and acceptance per depth as defined in
backend/events.py, pooled over all rounds; identical = same token ids as vanilla.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from backend.bench.context_ceiling import LONGEST
from backend.bench.runner import FLOAT_BASELINE, LLAMA_CPP, ROW_ORDER, BenchResult, MethodRun
from backend.engine.calibration import CostModel
from backend.engine.stats import slow_reasons
from backend.events import acceptance_per_depth, average_acceptance_length

T = TypeVar("T")  # a row that resampled_interval draws

LABELS = {
    "vanilla": "vanilla",
    "eagle": "EAGLE",
    "generate": "model.generate() (transformers)",
    "prompt_lookup": "prompt lookup (transformers)",
    FLOAT_BASELINE: "vanilla, float32 target",
    LLAMA_CPP: "llama.cpp, plain decoding of the GGUF file",
}
_COLOURS = {"vanilla": "#888", "eagle": "#2a7", "generate": "#aaa", "prompt_lookup": "#58c"}
_NO_ROUNDS = ("generate", "prompt_lookup", LLAMA_CPP)  # other loops: no rounds to count


@dataclass(frozen=True, slots=True)
class MethodSummary:
    method: str
    tokens: int
    seconds: float
    tokens_per_s: float
    speedup: float  # versus vanilla in the same run
    ttft_s: float  # mean
    identical: int  # prompts whose tokens equal vanilla's
    tau: float | None
    accept_per_depth: tuple[float, ...]
    draft_share: float | None  # fraction of round time spent drafting
    verify_share: float | None
    decode_speedup: float | None = None  # after the first token: prefill left out of both sides
    accepted_head: int = 0  # accepted drafts the head proposed
    accepted_context: int = 0  # accepted drafts copied from the context


def _tau(runs: list[MethodRun]) -> float | None:
    """Pooled over the runs' rounds: every token after a run's first came from a round."""
    rounds = sum(r.rounds for r in runs)
    if not rounds:
        return None
    return average_acceptance_length(sum(r.new_tokens - 1 for r in runs if r.new_tokens), rounds)


def _decode_tokens_per_s(runs: list[MethodRun]) -> float | None:
    """Tokens after the first over the rounds' time: decoding alone, without the prompt work
    (the prefill, identical for every method and most of the time at long prompts, and EAGLE's
    head over the prompt)."""
    if any(r.ttft_s <= 0 for r in runs):
        return None  # the library's loops report no first-token time
    tokens = sum(max(0, r.new_tokens - 1) for r in runs)
    seconds = sum(r.decode_s for r in runs)
    return tokens / seconds if seconds > 0 else None


DRAFT_LABELS = {"head": "head drafts", "context": "context drafts", "both": "head + context"}


def label(method: str) -> str:
    """Display name of a method; ``eagle@SHAPE`` rows are EAGLE with that fixed tree,
    ``eagle:SOURCES`` rows auto EAGLE drafting from those sources."""
    if method.startswith("eagle@"):
        return f"EAGLE, fixed tree {method.removeprefix('eagle@')}"
    if method.startswith("eagle:"):
        return f"EAGLE, {DRAFT_LABELS[method.removeprefix('eagle:')]}"
    return LABELS[method]


def _method_order(method: str) -> tuple[int, int]:
    """Vanilla, EAGLE, its rows for other draft sources, its fixed-tree rows, the library's
    loops, then the other models'."""
    base = method.split("@")[0].split(":")[0]
    return (ROW_ORDER.index(base), 1 if ":" in method else 2 if "@" in method else 0)


def best_fixed_tree(summaries: dict[str, MethodSummary]) -> MethodSummary | None:
    fixed = [m for name, m in summaries.items() if name.startswith("eagle@")]
    return max(fixed, key=lambda m: m.tokens_per_s) if fixed else None


def share_of_best_fixed_interval(
    result: BenchResult, method: str = "eagle", draws: int = 2000, seed: int = 0
) -> tuple[float, float] | None:
    """A 90% interval of ``method``'s tokens/s over the best fixed tree's (see
    ``ratio_interval``). None without fixed-tree rows or with one prompt."""
    fixed = sorted({m for p in result.prompts for m in p.runs if m.startswith("eagle@")})
    return ratio_interval(result, method, fixed, draws, seed)


def ratio_interval(
    result: BenchResult, method: str, against: list[str], draws: int = 2000, seed: int = 0
) -> tuple[float, float] | None:
    """A 90% interval of ``method``'s tokens/s over the fastest of ``against``, resampling the
    prompts (with replacement) and choosing the fastest again in every draw: the spread a
    different prompt sample would show, and the edge that picking the best of several noisy
    rows after the fact gives them. None without rows to compare or with one prompt."""
    rows = [p.runs for p in result.prompts if all(m in p.runs for m in (method, *against))]
    if not against or len(rows) < 2:
        return None

    def share(sample: list[dict[str, MethodRun]]) -> float | None:
        speed = {m: pooled_tokens_per_s(run[m] for run in sample) for m in (method, *against)}
        best = max(speed[m] for m in against)
        return speed[method] / best if best > 0 else None

    return resampled_interval(rows, share, draws, seed)


def resampled_interval(
    rows: list[T], statistic: Callable[[list[T]], float | None], draws: int = 2000, seed: int = 0
) -> tuple[float, float] | None:
    """A 90% interval of ``statistic`` over ``rows`` resampled with replacement (a draw it
    scores None is left out); None when it scores none."""
    rng = random.Random(seed)
    values = []
    for _ in range(draws):
        value = statistic([rows[rng.randrange(len(rows))] for _ in rows])
        if value is not None:
            values.append(value)
    values.sort()
    if not values:
        return None
    return values[int(0.05 * (len(values) - 1))], values[int(0.95 * (len(values) - 1))]


def pooled_tokens_per_s(runs: Iterable[MethodRun]) -> float:
    """All the runs' new tokens over all their seconds."""
    tokens = seconds = 0.0
    for run in runs:
        tokens += run.new_tokens
        seconds += run.seconds
    return tokens / seconds if seconds > 0 else 0.0


def summarize(result: BenchResult) -> dict[str, MethodSummary]:
    by_method: dict[str, list[MethodRun]] = {}
    vanilla_ids: list[tuple[int, ...]] = []
    for prompt in result.prompts:
        for method, run in prompt.runs.items():
            by_method.setdefault(method, []).append(run)
        vanilla_ids.append(prompt.runs["vanilla"].token_ids if "vanilla" in prompt.runs else ())
    base_tps = base_decode = None
    summaries = {}
    for method in sorted(by_method, key=_method_order):
        runs = by_method[method]
        tokens = sum(r.new_tokens for r in runs)
        seconds = sum(r.seconds for r in runs)
        tps = tokens / seconds if seconds > 0 else 0.0
        decode = _decode_tokens_per_s(runs)
        if method == "vanilla":
            base_tps, base_decode = tps, decode
        eagle_like = any(r.acceptance_lengths for r in runs)
        round_time = sum(r.decode_s for r in runs)
        summaries[method] = MethodSummary(
            method=method,
            tokens=tokens,
            seconds=seconds,
            tokens_per_s=tps,
            speedup=tps / base_tps if base_tps else 1.0,
            ttft_s=sum(r.ttft_s for r in runs) / len(runs),
            identical=sum(1 for r, v in zip(runs, vanilla_ids) if r.token_ids == v),
            tau=_tau(runs) if method not in _NO_ROUNDS else None,
            accept_per_depth=acceptance_per_depth([n for r in runs for n in r.acceptance_lengths]),
            draft_share=sum(r.draft_s for r in runs) / round_time
            if eagle_like and round_time > 0
            else None,
            verify_share=sum(r.verify_s for r in runs) / round_time
            if eagle_like and round_time > 0
            else None,
            decode_speedup=decode / base_decode if decode and base_decode else None,
            accepted_head=sum(r.accepted_head for r in runs),
            accepted_context=sum(r.accepted_context for r in runs),
        )
    return summaries


def speedup_per_seed(result: BenchResult, method: str = "eagle") -> list[float]:
    """``method``'s speedup over vanilla in each pass over the prompts (one per seed)."""
    speedups = []
    for seed in sorted({p.seed for p in result.prompts}):
        prompts = [p for p in result.prompts if p.seed == seed]
        summaries = summarize(dataclasses.replace(result, prompts=prompts))
        if method in summaries:
            speedups.append(summaries[method].speedup)
    return speedups


def shape_shares(result: BenchResult, method: str = "eagle") -> list[tuple[str, float]]:
    """Which tree shapes ``method`` verified, as shares of its rounds, most used first."""
    counts: dict[str, int] = {}
    for prompt in result.prompts:
        run = prompt.runs.get(method)
        for name, rounds in run.tree_shapes if run is not None else ():
            counts[name] = counts.get(name, 0) + rounds
    total = sum(counts.values())
    return sorted(((n, c / total) for n, c in counts.items()), key=lambda x: -x[1]) if total else []


def why_slow(result: BenchResult, eagle: MethodSummary) -> str:
    """Plain-words reasons EAGLE's speedup is limited: the engine's explainer on pooled runs."""
    sizes = [
        size for p in result.prompts if "eagle" in p.runs for size in p.runs["eagle"].tree_sizes
    ]
    ratios = result.costs.get("verify_ratio")
    costs = CostModel({int(n): float(r) for n, r in ratios.items()}, 0.0) if ratios else None
    return slow_reasons(
        eagle.tau or 0.0,
        sizes,
        eagle.draft_share or 0.0,
        costs.verify_ratio if costs is not None else None,
    )


def _round_threads(settings: dict) -> str:
    """Where plain steps or drafted rounds ran on other thread counts than the machine line's:
    ", plain steps on P threads, drafted rounds on D"."""
    threads = settings.get("round_threads")
    if not isinstance(threads, dict):
        return ""
    plain, drafted = threads.get("plain"), threads.get("drafted")
    machine = settings.get("machine", "")
    if not plain or not drafted:
        return ""
    if all(f" {n} torch threads" in machine for n in (plain, drafted)):
        return ""
    return f", plain steps on {plain} thread(s), drafted rounds on {drafted}"


def to_markdown(result: BenchResult, summaries: dict[str, MethodSummary], command: str) -> str:
    s = result.settings
    lines = [
        f"Machine: {s['machine']}, device {s['device']}, {s['dtype']}, torch {s['torch']}"
        f"{_round_threads(s)}. {s['num_prompts']} prompts (mean {s.get('prompt_tokens_mean', '?')} tokens), "
        f"max {s['max_new_tokens']} new tokens, temperature "
        f"{s['temperature']}, tree {s['tree']}; each prompt run {s.get('repeats', 1)}x per "
        "method, interleaved, median run kept.",
        "",
        f"Command: `{command}`",
        "",
        "| method | tokens/s | speedup | tau | identical to vanilla | mean TTFT (s) |",
        "|---|---|---|---|---|---|",
    ]
    for m in summaries.values():
        tau = f"{m.tau:.2f}" if m.tau is not None else "-"
        lines.append(
            f"| {label(m.method)} | {m.tokens_per_s:.1f} | {m.speedup:.2f}x | {tau} | "
            f"{m.identical}/{len(result.prompts)} | {m.ttft_s:.3f} |"
        )
    lines += _run_facts(result)
    eagle = summaries.get("eagle")
    if eagle is not None:
        lines += _eagle_facts(result, summaries, eagle)
    return "\n".join(lines) + "\n"


def _eagle_facts(
    result: BenchResult, summaries: dict[str, MethodSummary], eagle: MethodSummary
) -> list[str]:
    """Where EAGLE's time went and what it accepted, below the table."""
    lines: list[str] = []
    depths = ", ".join(f"d{i + 1}: {p:.2f}" for i, p in enumerate(eagle.accept_per_depth[:8]))
    lines += [
        "",
        f"Acceptance per draft depth (share of rounds accepting at least d drafts): {depths}",
    ]
    if eagle.draft_share is not None:
        other = max(0.0, 1 - eagle.draft_share - eagle.verify_share)
        lines.append(
            f"Round time: drafting {100 * eagle.draft_share:.0f}%, verification "
            f"{100 * eagle.verify_share:.0f}%, bookkeeping {100 * other:.0f}%."
        )
    ratios = result.costs.get("verify_ratio")
    if ratios:
        shown = ", ".join(
            f"{n}: {r:.2f}x" for n, r in ratios.items() if n in ("2", "4", "8", "16", "32", "60")
        )
        lines.append(
            f"Verify cost relative to one step, by tree size: {shown}; "
            f"one draft step = {result.costs['draft_step_ratio']:.2f}x one step "
            f"({result.costs.get('chain_step_ratio', 0):.2f}x in a top-1 chain)."
        )
    lines += _best_fixed_fact(result, summaries, eagle)
    sources = [
        f"{label(m.method)} {m.accepted_head / m.tokens:.0%} head, "
        f"{m.accepted_context / m.tokens:.0%} context"
        for m in summaries.values()
        if m.method.startswith("eagle") and m.tokens
    ]
    lines.append(f"New tokens written by accepted drafts, by source: {'; '.join(sources)}.")
    ceiling = context_ceiling(result)
    if ceiling is not None:
        lines.append(
            f"Ceiling of context drafts on vanilla's replies: {ceiling:.2f} tokens per round "
            f"(an oracle round verifying every continuation the context offers, up to {LONGEST} "
            "tokens each, and keeping the longest the reply follows)."
        )
    shapes = shape_shares(result)
    if shapes:
        lines.append(
            "Trees verified by EAGLE (share of rounds): "
            + ", ".join(f"{name} {share:.0%}" for name, share in shapes[:6])
            + "."
        )
    reason = why_slow(result, eagle)
    if reason:
        lines.append(f"Why the speedup is limited: {reason}.")
    return lines


def _best_fixed_fact(
    result: BenchResult, summaries: dict[str, MethodSummary], eagle: MethodSummary
) -> list[str]:
    """How EAGLE's tree fared against the best fixed tree of the same run (none without one)."""
    best = best_fixed_tree(summaries)
    if best is None:
        return []
    interval = share_of_best_fixed_interval(result)
    spread = (
        f"; {interval[0]:.0%}-{interval[1]:.0%} over resampled prompts, 90% interval"
        if interval
        else ""
    )
    return [
        f"EAGLE ({result.settings['tree']}) runs at {eagle.tokens_per_s / best.tokens_per_s:.0%} "
        f"of the best fixed tree in this run ({label(best.method)}, "
        f"{best.tokens_per_s:.1f} tok/s{spread})."
    ]


def context_ceiling(result: BenchResult) -> float | None:
    """Vanilla's tokens after its first per oracle round of context drafts, pooled over
    prompts (None when no prompt has it)."""
    pairs = [
        (len(p.runs["vanilla"].token_ids) - 1, p.ceiling_rounds)
        for p in result.prompts
        if p.ceiling_rounds and "vanilla" in p.runs
    ]
    if not pairs:
        return None
    return sum(tokens for tokens, _ in pairs) / sum(rounds for _, rounds in pairs)


def _run_facts(result: BenchResult) -> list[str]:
    """Seeds, load-time calibration and memory: what the table's averages do not show."""
    s, lines = result.settings, []
    per_seed = speedup_per_seed(result)
    if len(per_seed) > 1:
        shown = ", ".join(f"{x:.2f}x" for x in per_seed)
        mean = sum(per_seed) / len(per_seed)
        lines += [
            "",
            f"EAGLE speedup per seed ({len(per_seed)} seeds): {shown}; mean {mean:.2f}x "
            f"(the table pools all seeds' tokens and seconds).",
        ]
    facts = []
    if "calibration_s" in s:
        calibration = s["calibration_s"]
        facts.append(
            f"round-cost calibration at load {calibration:.1f} s"
            if calibration
            else "round costs read from the on-disk cache"
        )
    if "tuning_restored" in s:
        facts.append(
            "round tuner started from what an earlier run learned"
            if s["tuning_restored"]
            else "round tuner started afresh"
        )
    if "load_s" in s:
        facts.append(f"load {s['load_s']:.1f} s")
    facts += _fidelity_facts(s)
    if s.get("peak_rss_bytes"):
        facts.append(f"peak resident memory {s['peak_rss_bytes'] / 2**30:.2f} GiB")
    peaks = (
        {
            m: max(p.runs[m].peak_memory_bytes or 0 for p in result.prompts)
            for m in result.prompts[0].runs
        }
        if result.prompts
        else {}
    )
    if any(peaks.values()):
        facts.append(
            "device memory peak "
            + ", ".join(f"{label(m)} {v / 2**30:.2f} GiB" for m, v in peaks.items() if v)
        )
    if s.get("first_message_tok_s") and s.get("second_message_tok_s"):
        first, second = s["first_message_tok_s"], s["second_message_tok_s"]
        length = f", {s['first_message_tokens']} tokens each" if "first_message_tokens" in s else ""
        facts.append(
            f"first EAGLE reply after load {first:.1f} tok/s, the same reply next "
            f"{second:.1f} tok/s ({first / second:.0%}{length})"
        )
    if facts:
        lines += ["", "Run: " + "; ".join(facts) + "."]
    return lines


def _fidelity_facts(settings: dict) -> list[str]:
    """A quantized target's agreement with its float32 load (bench --quantize)."""
    fidelity = settings.get("fidelity")
    if not fidelity:
        return []
    return [
        f"quantized target against float32 on the prompts' text: top-1 agreement "
        f"{fidelity['top1_agreement']:.1%}, mean KL {fidelity['mean_kl']:.4f} nats/token "
        f"over {fidelity['tokens']} tokens"
    ]


def plot(summaries: dict[str, MethodSummary], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    names = [label(m) for m in summaries]
    left.bar(
        names,
        [m.tokens_per_s for m in summaries.values()],
        color=[_COLOURS.get(m.split("@")[0], "#aaa") for m in summaries],
    )
    left.set_ylabel("tokens/s")
    left.set_title("Decoding speed")
    left.tick_params(axis="x", labelsize=8)
    eagle = summaries.get("eagle")
    if eagle is not None and eagle.accept_per_depth:
        depths = list(range(1, len(eagle.accept_per_depth) + 1))
        right.bar(depths, eagle.accept_per_depth, color="#2a7")
        right.set_xlabel("draft depth d")
        right.set_ylabel("rounds accepting >= d drafts")
        right.set_title(f"EAGLE acceptance (tau {eagle.tau:.2f})")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_reports(result: BenchResult, out_dir: Path, command: str) -> dict[str, MethodSummary]:
    out_dir.mkdir(parents=True, exist_ok=True)
    summaries = summarize(result)
    data = result.to_json()
    data["summary"] = {m: _as_dict(s) for m, s in summaries.items()}
    interval = share_of_best_fixed_interval(result)
    if interval is not None:
        data["share_of_best_fixed_interval"] = list(interval)
    data["command"] = command
    (out_dir / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    (out_dir / "summary.md").write_text(to_markdown(result, summaries, command))
    plot(summaries, out_dir / "speed.png")
    return summaries


def _as_dict(summary: MethodSummary) -> dict[str, Any]:
    return {name: getattr(summary, name) for name in summary.__slots__}
