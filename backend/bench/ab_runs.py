"""``bench --cold-runs N --against REV``: this checkout's engine against another revision's, on
the same machine, back to back.

Each of the N rounds runs the bench once with this checkout and once with REV (a git worktree
kept under ``.cache/ab/``), each cold (a new process, an empty cache directory), alternating
which goes first so that a drift of the machine's speed favours neither. Options that REV's
bench does not know (read from its ``--help``) are left out of its command and named in the
report. A round's ratio is EAGLE's tokens/s here over REV's on the same prompts, with a 90%
interval from resampling the prompts in pairs; vanilla's ratio beside it shows how far the two
processes' machine differed. The noise rule then reads as for any ratio: the median over the
rounds and every round's interval. The speedup ratio (each side's EAGLE over its own vanilla,
interleaved in one process, here over there) takes the machine's drift between the two cold
runs out, which on a shared machine can be as large as the effect being measured.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from backend.bench.cold_runs import cold_run, without
from backend.bench.report import pooled_tokens_per_s, ratio_interval, resampled_interval
from backend.bench.runner import BenchResult, PromptResult
from backend.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
WORKTREES = ROOT / ".cache" / "ab"
THEIRS = "theirs"  # the other revision's runs, beside ours in one paired result


def run_ab(revision: str, count: int, argv: list[str], out: Path) -> int:
    """Alternate ``count`` cold bench runs of ``argv`` (``sys.argv[1:]`` less the options that
    start this) here and at ``revision``, then report EAGLE's and vanilla's ratios."""
    if count < 1:
        raise ConfigError(f"--cold-runs must be at least 1, got {count}")
    their_root = worktree(revision)
    ours_args = without(argv, "--cold-runs", "--out", "--against")
    theirs_args, dropped = known_options(ours_args, bench_help(their_root))
    rounds = []
    for index in range(1, count + 1):
        sides = [("ours", ROOT, ours_args), (THEIRS, their_root, theirs_args)]
        results = {
            name: cold_run(root / "launch.py", args, out / f"{name}-{index}", f"{name} {index}")
            for name, root, args in (sides if index % 2 else sides[::-1])
        }
        rounds.append(compare(results["ours"], results[THEIRS]))
    table = {"revision": revision, "dropped_for_theirs": dropped, "rounds": rounds}
    for method in ("eagle", "vanilla", "speedup"):
        table[f"median_{method}"] = statistics.median(r[method]["ratio"] for r in rounds)
    (out / "ab.json").write_text(json.dumps(table, indent=1) + "\n")
    text = ab_markdown(table, " ".join(["python launch.py", *argv]))
    (out / "ab.md").write_text(text)
    print(text)
    return 0


def compare(ours: BenchResult, theirs: BenchResult) -> dict[str, dict]:
    """Per method (EAGLE's automatic rounds, vanilla): tokens/s here over there on the prompts
    both ran, with the paired 90% interval."""
    their_runs = {(p.prompt.question_id, p.seed): p.runs for p in theirs.prompts}
    paired = []
    for prompt in ours.prompts:
        other = their_runs.get((prompt.prompt.question_id, prompt.seed))
        if other is None:
            continue
        runs = dict(prompt.runs)
        runs.update({f"{THEIRS} {m}": run for m, run in other.items()})
        paired.append(PromptResult(prompt.prompt, prompt.seed, runs))
    if not paired:
        raise ConfigError("the two revisions' benches share no prompt")
    merged = replace(ours, prompts=paired)
    table = {}
    for method in ("eagle", "vanilla"):
        mine = [p.runs[method] for p in paired if method in p.runs]
        other = [p.runs[f"{THEIRS} {method}"] for p in paired if f"{THEIRS} {method}" in p.runs]
        if not mine or len(mine) != len(other):
            raise ConfigError(f"both revisions' benches must run {method} on every prompt")
        speeds = [pooled_tokens_per_s(mine), pooled_tokens_per_s(other)]
        table[method] = {
            "ours_tokens_per_s": speeds[0],
            "theirs_tokens_per_s": speeds[1],
            "ratio": speeds[0] / speeds[1] if speeds[1] > 0 else 0.0,
            "interval": ratio_interval(merged, method, [f"{THEIRS} {method}"]),
        }
    rows = [p.runs for p in paired]
    table["speedup"] = {
        "ratio": _speedup_ratio(rows),
        "interval": resampled_interval(rows, _speedup_ratio),
    }
    return table


def _speedup_ratio(rows: list[dict]) -> float:
    """EAGLE's speedup over vanilla here, over the same there, each pooled over ``rows``."""

    def speedup(prefix: str) -> float:
        vanilla = pooled_tokens_per_s(row[f"{prefix}vanilla"] for row in rows)
        eagle = pooled_tokens_per_s(row[f"{prefix}eagle"] for row in rows)
        return eagle / vanilla if vanilla > 0 else 0.0

    there = speedup(f"{THEIRS} ")
    return speedup("") / there if there > 0 else 0.0


def ab_markdown(table: dict, command: str) -> str:
    lines = [
        f"A/B of `{command}` against revision {table['revision']}: cold runs alternated, "
        "tokens/s here over there on the same prompts (90% interval over resampled prompt pairs).",
        "",
        "| round | EAGLE here | EAGLE there | EAGLE ratio | vanilla ratio | speedup ratio |",
        "|---|---|---|---|---|---|",
    ]
    for index, entry in enumerate(table["rounds"], start=1):
        eagle, vanilla = entry["eagle"], entry["vanilla"]
        lines.append(
            f"| {index} | {eagle['ours_tokens_per_s']:.1f} | {eagle['theirs_tokens_per_s']:.1f} "
            f"| {_ratio(eagle)} | {_ratio(vanilla)} | {_ratio(entry['speedup'])} |"
        )
    medians = " | ".join(f"{table[f'median_{m}']:.3f}" for m in ("eagle", "vanilla", "speedup"))
    lines.append(f"| median | | | {medians} |")
    if table["dropped_for_theirs"]:
        lines += [
            "",
            "Left out of the other revision's command (it does not know them): "
            + " ".join(f"`{a}`" for a in table["dropped_for_theirs"])
            + ".",
        ]
    return "\n".join(lines) + "\n"


def worktree(revision: str) -> Path:
    """A checkout of ``revision`` under .cache/ab (made once, by commit)."""
    try:
        commit = _git("rev-parse", "--verify", f"{revision}^{{commit}}").strip()
    except subprocess.CalledProcessError as error:
        raise ConfigError(f"no revision {revision!r} in this repository") from error
    path = WORKTREES / commit[:12]
    if not (path / "launch.py").is_file():
        WORKTREES.mkdir(parents=True, exist_ok=True)
        _git("worktree", "add", "--force", "--detach", str(path), commit)
    return path


def bench_help(root: Path) -> str:
    done = subprocess.run(
        [sys.executable, str(root / "launch.py"), "bench", "--help"],
        capture_output=True,
        text=True,
        check=True,
        cwd=root,
    )
    return done.stdout


def known_options(argv: list[str], help_text: str) -> tuple[list[str], list[str]]:
    """``argv`` without the options (and their values) that ``help_text`` does not list."""
    known = set(re.findall(r"--[a-z][a-z0-9-]*", help_text))
    kept, dropped, dropping = [], [], False
    for arg in argv:
        if arg.startswith("--"):
            dropping = arg.split("=", 1)[0] not in known
        (dropped if dropping else kept).append(arg)
    return kept, dropped


def _ratio(entry: dict) -> str:
    low_high = entry["interval"]
    spread = f" ({low_high[0]:.3f}-{low_high[1]:.3f})" if low_high else ""
    return f"{entry['ratio']:.3f}{spread}"


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
