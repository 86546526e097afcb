"""``bench --cold-runs N``: the noise rule in one command.

A ratio bar (auto against the best fixed tree, EAGLE against vanilla, both draft sources
against the head alone) holds when the median over N cold runs reaches it and, in every run,
the 90% interval over resampled prompts reaches it too. Each run is a new process with an empty
cache directory, so nothing measured or learned by an earlier run (calibration, tuner state)
carries over. The runs go to OUT/run-1..N; the medians and intervals to OUT/cold-runs.md and
OUT/cold-runs.json.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from backend.bench.report import label, ratio_interval, summarize
from backend.bench.runner import BenchResult
from backend.errors import ConfigError

LAUNCH = Path(__file__).resolve().parents[2] / "launch.py"


def run_cold(count: int, argv: list[str], out: Path) -> int:
    """Run the bench of ``argv`` (``sys.argv[1:]``, its --cold-runs and --out left out) ``count``
    times, cold, then report the ratios' medians and intervals."""
    if count < 1:
        raise ConfigError(f"--cold-runs must be at least 1, got {count}")
    bench_args = without(argv, "--cold-runs", "--out")
    results = [
        cold_run(LAUNCH, bench_args, out / f"run-{index}", f"cold run {index}/{count}")
        for index in range(1, count + 1)
    ]
    table = cold_ratios(results)
    (out / "cold-runs.json").write_text(json.dumps(table, indent=1) + "\n")
    text = cold_markdown(table, " ".join(["python launch.py", *argv]))
    (out / "cold-runs.md").write_text(text)
    print(text)
    return 0


def cold_run(launch: Path, bench_args: list[str], run_dir: Path, name: str) -> BenchResult:
    """One bench run of ``launch`` (a checkout's launch.py) in a new process with an empty
    cache directory; its result read back from ``run_dir``."""
    with tempfile.TemporaryDirectory(prefix="eaglechat-cold-") as cache:
        env = {**os.environ, "EAGLECHAT_CACHE_DIR": cache}
        command = [sys.executable, str(launch), *bench_args, "--out", str(run_dir)]
        print(f"{name}: {' '.join(command[1:])}", file=sys.stderr)
        subprocess.run(command, env=env, check=True)
    return BenchResult.from_json(json.loads((run_dir / "results.json").read_text()))


def cold_ratios(results: list[BenchResult]) -> dict[str, dict]:
    """Per ratio: each run's value and 90% interval, and the median value."""
    ratios: dict[str, dict] = {}
    for result in results:
        summaries = summarize(result)
        fixed = [m for m in summaries if m.startswith("eagle@")]
        eagles = [m for m in summaries if m.startswith("eagle") and m not in fixed]
        pairs = [(m, ["vanilla"]) for m in summaries if m != "vanilla" and "vanilla" in summaries]
        if fixed and "eagle" in summaries:
            pairs.append(("eagle", fixed))
        pairs += [("eagle", [other]) for other in eagles if other != "eagle"]
        for method, against in pairs:
            name = f"{label(method)} / " + (
                "best fixed tree" if len(against) > 1 else label(against[0])
            )
            speed = summaries[method].tokens_per_s
            base = max(summaries[m].tokens_per_s for m in against)
            entry = ratios.setdefault(name, {"runs": [], "intervals": []})
            entry["runs"].append(speed / base if base else 0.0)
            entry["intervals"].append(ratio_interval(result, method, against))
    for entry in ratios.values():
        entry["median"] = statistics.median(entry["runs"])
    return ratios


def cold_markdown(ratios: dict[str, dict], command: str) -> str:
    lines = [
        f"Cold runs of `{command}`: median over runs, then each run's value with its 90% "
        "interval over resampled prompts.",
        "",
        "| ratio | median | runs (90% interval) |",
        "|---|---|---|",
    ]
    for name, entry in ratios.items():
        runs = ", ".join(
            f"{value:.3f}" + (f" ({low:.3f}-{high:.3f})" if interval else "")
            for value, interval in zip(entry["runs"], entry["intervals"])
            for low, high in [interval or (0.0, 0.0)]
        )
        lines.append(f"| {name} | {entry['median']:.3f} | {runs} |")
    return "\n".join(lines) + "\n"


def without(argv: list[str], *options: str) -> list[str]:
    """``argv`` without the given options and their values (``--out X`` or ``--out=X``)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in options:
            skip = True
            continue
        if any(arg.startswith(f"{option}=") for option in options):
            continue
        kept.append(arg)
    return kept
