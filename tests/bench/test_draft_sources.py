"""The bench's draft-source rows, its prompt sets whose replies repeat their context (multi-turn
included), and the cold-runs summary (the noise rule). No timing thresholds."""

from __future__ import annotations

import dataclasses
import json

import pytest

from backend.bench.cold_runs import cold_markdown, cold_ratios, without
from backend.bench.prompt_sets import SET_SIZE, SETS, build_set, shared_root
from backend.bench.prompts import BenchPrompt
from backend.bench.report import label, ratio_interval, summarize, write_reports
from backend.bench.runner import BenchResult, BenchSpec, run_bench
from tests.bench.test_report import easy_pair_on_disk, hand_made

needs_shared = pytest.mark.skipif(
    not (shared_root() / "bench").is_dir(), reason=f"no shared bench text at {shared_root()}"
)


@needs_shared
@pytest.mark.parametrize("name", list(SETS))
def test_each_set_builds_from_the_shared_text(name: str) -> None:
    prompts = build_set(name)
    assert len(prompts) == SET_SIZE
    assert len({p.text for p in prompts}) == SET_SIZE
    if name == "multi-turn":
        assert all(len(p.earlier) == 1 and p.earlier[0] != p.text for p in prompts)
    elif name == "repeats":  # the four sets in turn
        assert [p.category for p in prompts[:3]] == ["code-rewrite", "quotes", "structured"]
        assert prompts[3].earlier and prompts[4].category == "code-rewrite"
    else:
        assert all(not p.earlier for p in prompts)


@needs_shared
def test_a_code_rewrite_prompt_holds_the_code_it_asks_to_write_again() -> None:
    prompt = build_set("code-rewrite")[0]
    code = prompt.text.split("```python\n")[1].split("```")[0]
    name = code.split("def ", 1)[1].split("(")[0]
    assert f"`{name}` renamed to `{name}_v2`" in prompt.text
    assert prompt.text.endswith("```python\n")  # a base model continues with the code


def test_draft_source_rows_and_earlier_turns_on_a_tiny_pair(tmp_path) -> None:
    """Rows for each draft source, identical to vanilla; the earlier turn is answered once and
    every method continues the same conversation; the per-source line is written."""
    pair = easy_pair_on_disk(tmp_path)
    prompts = [
        BenchPrompt("0", "x", "and again", earlier=("say something",)),
        BenchPrompt("1", "x", "hello"),
    ]
    spec = BenchSpec(max_new_tokens=24, drafts=("both", "head", "context"))
    result = run_bench(pair, prompts, spec)
    summary = write_reports(result, tmp_path / "out", "cmd")
    for method in ("eagle", "eagle:head", "eagle:context"):
        assert summary[method].identical == 2, method
    assert summary["eagle:head"].accepted_context == 0
    assert summary["eagle:context"].accepted_head == 0
    assert label("eagle:context") == "EAGLE, context drafts"
    markdown = (tmp_path / "out" / "summary.md").read_text()
    assert "New tokens written by accepted drafts, by source: EAGLE " in markdown
    assert "EAGLE, head drafts " in markdown
    # the conversation grew by the first turn's reply: the second prompt is longer than a turn
    assert result.settings["prompt_tokens_min"] < result.settings["prompt_tokens_mean"]
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    again = BenchResult.from_json(data)
    assert summarize(again) == summarize(result)


def test_a_ratio_interval_spans_the_prompts_ratios() -> None:
    result = hand_made()
    low, high = ratio_interval(result, "eagle", ["vanilla"])
    per_prompt = [
        p.runs["eagle"].new_tokens
        / p.runs["eagle"].seconds
        * p.runs["vanilla"].seconds
        / p.runs["vanilla"].new_tokens
        for p in result.prompts
    ]
    assert min(per_prompt) - 1e-9 <= low <= high <= max(per_prompt) + 1e-9
    assert ratio_interval(result, "eagle", []) is None


def test_cold_runs_report_each_ratios_median_and_intervals() -> None:
    slow, fast = hand_made(), hand_made()
    for prompt in fast.prompts:
        prompt.runs["eagle"] = dataclasses.replace(
            prompt.runs["eagle"], seconds=prompt.runs["eagle"].seconds / 2
        )
    ratios = cold_ratios([slow, fast, slow])
    eagle = ratios["EAGLE / vanilla"]
    assert len(eagle["runs"]) == 3 and eagle["runs"][0] == eagle["runs"][2] < eagle["runs"][1]
    assert eagle["median"] == eagle["runs"][0]
    assert all(interval is not None for interval in eagle["intervals"])
    assert "| EAGLE / vanilla |" in cold_markdown(ratios, "python launch.py bench")


def test_the_cold_runs_command_drops_its_own_options() -> None:
    argv = ["bench", "--pair", "demo", "--cold-runs", "3", "--out=x", "--limit", "2"]
    assert without(argv, "--cold-runs", "--out") == ["bench", "--pair", "demo", "--limit", "2"]
    argv = ["bench", "--out", "y", "--cold-runs=3"]
    assert without(argv, "--cold-runs", "--out") == ["bench"]
