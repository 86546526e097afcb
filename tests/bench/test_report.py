"""Benchmark bookkeeping on hand-made runs (exact ratios, tau, identity counts) and one real
run on a tiny pair. No timing thresholds."""

from __future__ import annotations

import json

import pytest

from backend.bench.prompts import BenchPrompt, load_prompts
from backend.bench.report import (
    share_of_best_fixed_interval,
    speedup_per_seed,
    summarize,
    to_markdown,
    write_reports,
)
from backend.bench.runner import (
    BenchResult,
    BenchSpec,
    MethodRun,
    PromptResult,
    _first_messages,
    median_run,
    run_bench,
    run_engine,
)
from backend.config import GenerationConfig, LoadConfig, TreeConfig
from backend.engine.calibration import CostModel
from backend.engine.stats import SpecStats, explain
from backend.errors import ConfigError, InputError
from backend.services.loading import load_pair
from backend.services.prompting import prompt_ids
from models.checkpoints import save_head
from tests.factories import easy_llama_pair, tiny_tokenizer


def hand_made() -> BenchResult:
    prompts = []
    for index, (vanilla_ids, eagle_ids) in enumerate(
        [((1, 2, 3, 4), (1, 2, 3, 4)), ((5, 6), (5, 7))]
    ):
        prompt = PromptResult(BenchPrompt(str(index), "x", "hi"))
        prompt.runs["vanilla"] = MethodRun(
            "vanilla",
            vanilla_ids,
            seconds=2.0,
            ttft_s=0.5,
            rounds=len(vanilla_ids) - 1,
            acceptance_lengths=(),
        )
        prompt.runs["eagle"] = MethodRun(
            "eagle",
            eagle_ids,
            seconds=0.5,
            ttft_s=0.1,
            rounds=1,
            acceptance_lengths=(len(eagle_ids) - 1,),
            draft_s=0.1,
            verify_s=0.2,
        )
        prompt.runs["prompt_lookup"] = MethodRun("prompt_lookup", vanilla_ids, 1.0, 0.0, 0, ())
        prompts.append(prompt)
    settings = {
        "machine": "m",
        "device": "cpu",
        "dtype": "float32",
        "torch": "t",
        "num_prompts": 2,
        "max_new_tokens": 4,
        "temperature": 0.0,
        "tree": "auto",
    }
    return BenchResult(settings, {"verify_ratio": {"8": 1.9}, "draft_step_ratio": 0.1}, prompts)


def test_ratios_tau_and_identity_counts() -> None:
    summary = summarize(hand_made())
    vanilla, eagle, lookup = summary["vanilla"], summary["eagle"], summary["prompt_lookup"]
    assert vanilla.tokens == 6 and vanilla.tokens_per_s == pytest.approx(6 / 4.0)
    assert eagle.tokens_per_s == pytest.approx(6 / 1.0)
    assert eagle.speedup == pytest.approx(4.0)
    assert lookup.speedup == pytest.approx((6 / 2.0) / (6 / 4.0))
    assert eagle.identical == 1 and lookup.identical == 2 and vanilla.identical == 2
    assert eagle.tau == pytest.approx((3 + 1) / 2)  # tokens after the first / rounds
    assert vanilla.tau == pytest.approx(1.0)
    assert eagle.accept_per_depth == (0.5, 0.5)  # gained 3 and 1 tokens: 2 and 0 drafts
    assert eagle.draft_share == pytest.approx(0.2 / 0.8)  # drafting / time after the prefill
    table = to_markdown(hand_made(), summary, "python launch.py bench")
    assert "| EAGLE | 6.0 | 4.00x | 2.00 | 1/2 |" in table


def test_the_report_and_the_chat_panel_explain_a_slow_run_in_the_same_words() -> None:
    """One explainer: the bench's reasons are the engine's for the same rounds and costs."""
    sizes, accepted = (8, 1, 8, 1), (1, 0, 0, 0)  # a 2-token round, then three 1-token ones
    prompt = PromptResult(BenchPrompt("0", "x", "hi"))
    prompt.runs["vanilla"] = MethodRun("vanilla", (1, 2, 3, 4, 5, 6), 2.0, 0.5, 5, ())
    gained = tuple(drafts + 1 for drafts in accepted)  # acceptance lengths: tokens per round
    prompt.runs["eagle"] = MethodRun(
        "eagle",
        (1, 2, 3, 4, 5, 6),
        seconds=1.0,
        ttft_s=0.2,
        rounds=4,
        acceptance_lengths=gained,
        draft_s=0.4,
        verify_s=0.4,
        tree_sizes=sizes,
    )
    result = hand_made()
    costs_json = {"verify_ratio": {"1": 1.0, "8": 2.5}, "draft_step_ratio": 0.1}
    result = BenchResult(result.settings, costs_json, [prompt])
    stats = SpecStats()
    for size, drafts in zip(sizes, accepted, strict=True):
        stats.add_round(drafts + 1, size, draft_s=0.1, verify_s=0.1)
    costs = CostModel({1: 1.0, 8: 2.5}, draft_step_s=0.0)
    reason = explain(stats, costs)
    assert "rarely accepted" in reason and "2 of 4 rounds fell back" in reason
    assert "verifying 8 tokens costs 2.5x" in reason and "drafting took 50%" in reason
    markdown = to_markdown(result, summarize(result), "cmd")
    assert f"Why the speedup is limited: {reason}." in markdown


def test_prompt_files(tmp_path) -> None:
    assert len(load_prompts()) >= 10
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "no turns"}\n')
    with pytest.raises(InputError, match="not a FastChat question"):
        load_prompts(bad)


def easy_pair_on_disk(tmp_path):
    """The easy Llama pair saved and loaded back the way the bench command loads pairs."""
    tokenizer = tiny_tokenizer(tmp_path / "target")
    target, head = easy_llama_pair(vocab_size=len(tokenizer))
    target.save_pretrained(tmp_path / "target")
    save_head(head, tmp_path / "head")
    return load_pair(LoadConfig(target=str(tmp_path / "target"), head=str(tmp_path / "head")))


def test_real_run_on_a_tiny_pair_writes_all_reports(tmp_path) -> None:
    pair = easy_pair_on_disk(tmp_path)
    prompts = load_prompts(limit=2)
    spec = BenchSpec(max_new_tokens=24, tree=TreeConfig(total_tokens=8, depth=4, top_k=2))
    result = run_bench(pair, prompts, spec)
    summary = write_reports(result, tmp_path / "out", "cmd")
    assert summary["eagle"].identical == 2  # greedy EAGLE == vanilla on every prompt
    assert summary["prompt_lookup"].identical == 2
    assert summary["generate"].identical == 2  # our plain loop == the library's greedy loop
    assert summary["generate"].tau is None
    assert result.settings["peak_rss_bytes"] > 0
    assert summary["eagle"].tau > 1.5
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert set(data["summary"]) == {"vanilla", "eagle", "generate", "prompt_lookup"}
    assert (tmp_path / "out" / "speed.png").stat().st_size > 1000
    markdown = (tmp_path / "out" / "summary.md").read_text()
    assert "Acceptance per draft depth" in markdown
    assert "Trees verified by EAGLE (share of rounds): 8/4/2 100%" in markdown
    first, second = result.settings["first_message_tok_s"], result.settings["second_message_tok_s"]
    assert first > 0 and second > 0  # the first reply after load is measured, then the same again
    assert f"first EAGLE reply after load {first:.1f} tok/s" in markdown
    assert result.settings["tuning_restored"] is False  # new weights: nothing learned yet
    assert "round tuner started afresh" in markdown
    length = result.settings["first_message_tokens"]  # the whole budget, past EOS
    assert length == spec.max_new_tokens and f"{length} tokens each" in markdown


def test_the_first_reply_probes_leave_the_tuner_as_they_found_it(tmp_path) -> None:
    pair = easy_pair_on_disk(tmp_path)
    ids = prompt_ids(pair.tokenizer, [{"role": "user", "content": "Hello there"}])
    greedy = GenerationConfig(mode="eagle", max_new_tokens=16, tree=TreeConfig(auto=True))
    run_engine(pair, ids, greedy)  # a reply that teaches the greedy policy something
    assert list(pair.engine.policies) == [(False, "both")]
    before = pair.engine.policies[False, "both"].learned()
    spec = BenchSpec(max_new_tokens=48, drafts=("head",))  # the probes use another policy too
    first = _first_messages(pair, ids, spec)
    assert first["first_message_tokens"] == 48  # they ran, past EOS
    assert list(pair.engine.policies) == [(False, "both")]  # the policy they made is gone
    assert pair.engine.policies[False, "both"].learned() == before
    spec = BenchSpec(max_new_tokens=48)  # probes on the policy the reply taught
    _first_messages(pair, ids, spec)
    assert pair.engine.policies[False, "both"].learned() == before
    run_engine(pair, ids, greedy)  # and it learns on from there
    assert pair.engine.policies[False, "both"].learned() != before


def test_repeats_keep_the_median_run_by_time_per_token() -> None:
    def run(seconds: float, tokens: int) -> MethodRun:
        return MethodRun("eagle", tuple(range(tokens)), seconds, 0.0, 1, ())

    fast, middle, burst = run(1.0, 10), run(3.0, 20), run(9.0, 10)  # 0.1, 0.15, 0.9 s/token
    assert median_run([burst, fast, middle]) is middle
    assert median_run([burst, fast]) is fast  # even count: the lower middle
    assert median_run([middle]) is middle


def test_repeated_bench_interleaves_and_records_repeats(tmp_path) -> None:
    pair = easy_pair_on_disk(tmp_path)
    order = []
    spec = BenchSpec(
        max_new_tokens=8,
        tree=TreeConfig(total_tokens=4, depth=3, top_k=1),
        methods=("vanilla", "eagle"),
        repeats=3,
    )
    result = run_bench(
        pair,
        load_prompts(limit=1),
        spec,
        progress=lambda index, total, method: order.append(method),
    )
    assert order == ["vanilla", "eagle"] * 3
    assert result.settings["repeats"] == 3
    assert "run 3x per method" in to_markdown(result, summarize(result), "cmd")


def test_sampling_runs_the_prompt_set_once_per_seed_and_reports_each(tmp_path) -> None:
    pair = easy_pair_on_disk(tmp_path)
    spec = BenchSpec(
        max_new_tokens=8,
        temperature=1.0,
        methods=("vanilla", "eagle"),
        seeds=3,
        tree=TreeConfig(total_tokens=4, depth=3, top_k=1),
    )
    result = run_bench(pair, load_prompts(limit=2), spec)
    assert [p.seed for p in result.prompts] == [0, 0, 1, 1, 2, 2]
    assert result.settings["seeds"] == 3
    per_seed = speedup_per_seed(result)
    assert len(per_seed) == 3 and all(x > 0 for x in per_seed)
    markdown = to_markdown(result, summarize(result), "cmd")
    assert "per seed (3 seeds)" in markdown
    assert "| 6/6 |" in markdown  # vanilla against itself: every run of every seed counted


def test_greedy_runs_ignore_seeds(tmp_path) -> None:
    pair = easy_pair_on_disk(tmp_path)
    spec = BenchSpec(max_new_tokens=4, methods=("vanilla",), seeds=3)
    result = run_bench(pair, load_prompts(limit=1), spec)
    assert len(result.prompts) == 1 and result.settings["seeds"] == 1


def test_fixed_trees_run_beside_auto_in_the_same_interleaved_run(tmp_path) -> None:
    from backend.bench.cli import parse_tree

    pair = easy_pair_on_disk(tmp_path)
    trees = (parse_tree("8/4/2"), parse_tree("chain3"))
    assert trees[1] == TreeConfig(total_tokens=4, depth=3, top_k=1)
    order: list[str] = []
    spec = BenchSpec(max_new_tokens=16, methods=("vanilla", "eagle"), compare_trees=trees)
    result = run_bench(
        pair,
        load_prompts(limit=2),
        spec,
        progress=lambda index, total, method: order.append(method),
    )
    assert order[:4] == ["vanilla", "eagle", "eagle@8/4/2", "eagle@chain 3"]
    summary = summarize(result)
    assert list(summary) == ["vanilla", "eagle", "eagle@8/4/2", "eagle@chain 3"]
    assert all(s.identical == 2 for s in summary.values())  # every tree is exact at T=0
    assert summary["eagle@chain 3"].tau <= 4.0  # a 3-chain yields at most 4 tokens a round
    markdown = to_markdown(result, summary, "cmd")
    assert "EAGLE, fixed tree 8/4/2" in markdown and "of the best fixed tree" in markdown


def test_a_malformed_tree_is_a_clear_error() -> None:
    from backend.bench.cli import parse_tree

    with pytest.raises(ConfigError, match="cannot read the tree"):
        parse_tree("16/5")


def _with_fixed_trees(auto_seconds: list[float], fixed_seconds: dict[str, list[float]]):
    """A run where every method makes 10 tokens per prompt in the given seconds."""
    prompts = []
    for index, seconds in enumerate(auto_seconds):
        prompt = PromptResult(BenchPrompt(str(index), "x", "hi"))
        runs = {"vanilla": 2.0, "eagle": seconds} | {m: s[index] for m, s in fixed_seconds.items()}
        for method, took in runs.items():
            prompt.runs[method] = MethodRun(method, tuple(range(10)), took, 0.1, 5, (2,) * 5)
        prompts.append(prompt)
    return BenchResult(hand_made().settings, {}, prompts)


def test_the_share_of_the_best_fixed_tree_comes_with_its_spread_over_prompts(tmp_path) -> None:
    steady = _with_fixed_trees([1.0] * 6, {"eagle@8/4/2": [0.9] * 6, "eagle@chain6": [1.2] * 6})
    low, high = share_of_best_fixed_interval(steady)
    assert low == pytest.approx(0.9) and high == pytest.approx(0.9)  # no spread to show
    # Two trees that take turns being faster: over all prompts each is as fast as auto, but a
    # resample mostly favours one of them, which the interval shows (a point reading does not).
    fast, slow = [0.8, 1.2] * 4, [1.2, 0.8] * 4
    noisy = _with_fixed_trees([1.0] * 8, {"eagle@8/4/2": fast, "eagle@chain6": slow})
    low, high = share_of_best_fixed_interval(noisy)
    assert low < 0.97 < high <= 1.0 + 1e-9
    summaries = write_reports(noisy, tmp_path, "python launch.py bench")
    assert "over resampled prompts, 90% interval" in (tmp_path / "summary.md").read_text()
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["share_of_best_fixed_interval"] == pytest.approx([low, high])
    assert summaries["eagle"].tokens_per_s == pytest.approx(10.0)
    assert share_of_best_fixed_interval(_with_fixed_trees([1.0], {"eagle@8/4/2": [0.9]})) is None
