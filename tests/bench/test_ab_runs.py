"""``bench --cold-runs N --against REV``: the A/B of two checkouts, run end to end on two fake
checkouts whose launch.py writes hand-made results (exact ratios, no timing)."""

from __future__ import annotations

import dataclasses
import json
import sys
import textwrap
from pathlib import Path

import pytest

from backend.bench import ab_runs
from backend.bench.ab_runs import compare, known_options, run_ab
from backend.errors import ConfigError
from tests.bench.test_report import hand_made

FAKE_LAUNCH = """
import json, sys
from pathlib import Path
here = Path(__file__).parent
with (here.parent / "calls.log").open("a") as log:
    log.write(json.dumps([here.name, sys.argv[1:]]) + "\\n")
if "--help" in sys.argv:
    print("usage: bench [--pair PAIR] [--limit LIMIT] [--out OUT] {extra}")
    sys.exit(0)
out = Path(sys.argv[sys.argv.index("--out") + 1])
out.mkdir(parents=True, exist_ok=True)
data = json.loads((here / "template.json").read_text())
for prompt in data["prompts"]:
    prompt["runs"]["eagle"]["seconds"] *= {eagle_factor}
(out / "results.json").write_text(json.dumps(data))
"""


def _checkout(root: Path, name: str, eagle_factor: float, extra: str) -> Path:
    path = root / name
    path.mkdir()
    (path / "launch.py").write_text(
        textwrap.dedent(FAKE_LAUNCH).format(eagle_factor=eagle_factor, extra=extra)
    )
    (path / "template.json").write_text(json.dumps(hand_made().to_json()))
    return path


def test_ab_alternates_cold_runs_and_reports_paired_ratios(tmp_path, monkeypatch) -> None:
    ours = _checkout(tmp_path, "ours", eagle_factor=1.0, extra="[--drafts DRAFTS]")
    theirs = _checkout(tmp_path, "theirs", eagle_factor=1.25, extra="")
    monkeypatch.setattr(ab_runs, "ROOT", ours)
    monkeypatch.setattr(ab_runs, "worktree", lambda revision: theirs)
    argv = ["bench", "--pair", "demo", "--drafts", "head", "--cold-runs", "3", "--against", "x"]
    assert run_ab("x", 3, argv, tmp_path / "out") == 0
    calls = [json.loads(line) for line in (tmp_path / "calls.log").read_text().splitlines()]
    runs = [(name, args) for name, args in calls if "--help" not in args]
    assert [name for name, _ in runs] == ["ours", "theirs", "theirs", "ours", "ours", "theirs"]
    for name, args in runs:  # their bench never sees the option it does not know
        assert ("--drafts" in args) == (name == "ours")
        assert "--cold-runs" not in args and "--against" not in args
    table = json.loads((tmp_path / "out" / "ab.json").read_text())
    assert table["median_eagle"] == pytest.approx(1.25)  # their EAGLE took 1.25x the seconds
    assert table["median_vanilla"] == pytest.approx(1.0)
    assert table["dropped_for_theirs"] == ["--drafts", "head"]
    markdown = (tmp_path / "out" / "ab.md").read_text()
    assert table["median_speedup"] == pytest.approx(1.25)  # the same vanilla on both sides
    assert "| median | | | 1.250 | 1.000 | 1.250 |" in markdown and "`--drafts`" in markdown


def test_paired_intervals_follow_the_prompts() -> None:
    ours, theirs = hand_made(), hand_made()
    slower = theirs.prompts[0].runs["eagle"]
    theirs.prompts[0].runs["eagle"] = dataclasses.replace(slower, seconds=slower.seconds * 3)
    table = compare(ours, theirs)
    low, high = table["eagle"]["interval"]
    assert 1.0 <= low <= table["eagle"]["ratio"] <= high <= 3.0
    assert table["vanilla"]["ratio"] == pytest.approx(1.0)
    strangers = hand_made()
    for prompt in strangers.prompts:
        prompt.prompt = dataclasses.replace(prompt.prompt, question_id="other")
    with pytest.raises(ConfigError, match="share no prompt"):
        compare(ours, strangers)


def test_the_speedup_ratio_takes_the_machines_drift_out() -> None:
    """Their whole run on a machine 1.5x slower (every method alike): tokens/s ratios read 1.5,
    while each side's EAGLE over its own vanilla is the same."""
    ours, theirs = hand_made(), hand_made()
    for prompt in theirs.prompts:
        for method, run in prompt.runs.items():
            prompt.runs[method] = dataclasses.replace(run, seconds=run.seconds * 1.5)
    table = compare(ours, theirs)
    assert table["eagle"]["ratio"] == pytest.approx(1.5)
    assert table["vanilla"]["ratio"] == pytest.approx(1.5)
    assert table["speedup"]["ratio"] == pytest.approx(1.0)
    low, high = table["speedup"]["interval"]
    assert low == pytest.approx(1.0) and high == pytest.approx(1.0)
    faster = ours.prompts[0].runs["eagle"]  # our EAGLE gains on one prompt: the interval widens
    ours.prompts[0].runs["eagle"] = dataclasses.replace(faster, seconds=faster.seconds / 2)
    table = compare(ours, theirs)
    low, high = table["speedup"]["interval"]
    assert 1.0 <= low <= table["speedup"]["ratio"] <= high and low < high


def test_unknown_options_are_dropped_with_their_values() -> None:
    argv = ["bench", "--pair", "demo", "--drafts", "head", "context", "--limit=2", "--new=1"]
    kept, dropped = known_options(argv, "usage: bench [--pair P] [--limit N]")
    assert kept == ["bench", "--pair", "demo", "--limit=2"]
    assert dropped == ["--drafts", "head", "context", "--new=1"]


def test_an_unknown_revision_is_a_clear_error() -> None:
    if not (ab_runs.ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    with pytest.raises(ConfigError, match="no revision"):
        ab_runs.worktree("no-such-revision-" + sys.platform)
