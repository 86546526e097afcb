"""Pure render functions: events in, component values out (no Gradio, no model)."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import pytest

from app.render import (
    CONTEXT_LABEL,
    HEAD_LABEL,
    ROUNDING_NOTE,
    SPAN_COLORS,
    TARGET_LABEL,
    LiveStats,
    acceptance_frame,
    error_markdown,
    error_text,
    fold,
    highlight_spans,
    lane_markdown,
    message_text,
    pair_info_markdown,
    plan_markdown,
    progress_html,
    progress_text,
    race_frame,
    race_verdict_markdown,
    stats_markdown,
)
from backend.events import (
    Finished,
    GenerationFailed,
    LoadFailed,
    Progress,
    RaceFinished,
    Started,
    TextSpan,
    format_bytes,
)
from tests.app.fakes import FakeBackend, make_info, scripted_rounds, summary_of


def test_spans_become_labelled_pieces_with_adjacent_sources_merged() -> None:
    spans = [
        TextSpan("Hel", "target"),
        TextSpan("lo", "target"),
        TextSpan(" wo", "head"),
        TextSpan("", "head"),
        TextSpan("rld", "head"),
        TextSpan(" wor", "context"),
        TextSpan("ld", "context"),
        TextSpan("!", "target"),
    ]
    assert highlight_spans(spans) == [
        ("Hello", TARGET_LABEL),
        (" world", HEAD_LABEL),
        (" world", CONTEXT_LABEL),
        ("!", TARGET_LABEL),
    ]
    assert len({SPAN_COLORS[label] for label in (HEAD_LABEL, CONTEXT_LABEL, TARGET_LABEL)}) == 3
    assert highlight_spans([]) == []


def test_live_stats_follow_the_rounds() -> None:
    rounds = scripted_rounds()
    stats = LiveStats()
    stats.update(Started("r", "eagle", 5))
    stats.update(rounds[0])
    assert stats.ttft_s == pytest.approx(0.1)
    assert stats.rounds == 0 and stats.tau is None
    for event in rounds[1:]:
        stats.update(event)
    # rounds 1..3 accepted 2, 0, 3 drafts: acceptance lengths 3, 1, 4
    assert stats.acceptance_lengths == [3, 1, 4]
    assert stats.new_tokens == 1 + 3 + 1 + 4
    assert stats.tau == pytest.approx(8 / 3)
    assert stats.tokens_per_forward == pytest.approx(9 / 4)  # prefill forward counted
    assert stats.tokens_per_s == pytest.approx(9 / 0.4)
    assert stats.decode_tokens_per_s == pytest.approx(8 / 0.3)
    assert stats.text == "Hello there, friend how are you today?"
    assert not stats.done


def test_decode_speed_leaves_the_heads_prompt_pass_out() -> None:
    """EAGLE's head reads the prompt between the first token and the first round: prompt
    work, which the decode speed leaves out as the bench does (vanilla has none)."""
    rounds = scripted_rounds()
    head_pass_s = 0.5
    late = [rounds[0]] + [
        replace(event, elapsed_s=event.elapsed_s + head_pass_s) for event in rounds[1:]
    ]
    stats = fold(late)
    assert stats.decode_start_s == pytest.approx(0.1 + head_pass_s)
    assert stats.decode_tokens_per_s == pytest.approx(8 / 0.3)  # as without the pass
    assert stats.tokens_per_s == pytest.approx(9 / (0.4 + head_pass_s))  # the whole reply


def test_stats_markdown_shows_every_number_and_the_final_state() -> None:
    rounds = scripted_rounds()
    stats = fold([*rounds, Finished("r", summary_of(rounds, "max_new_tokens"))])
    text = stats_markdown(stats)
    for expected in (
        "| tokens/s | 22.5 |",
        "| time to first token | 100 ms |",
        "| avg acceptance length (τ) | 2.67 |",
        "| last acceptance length | 4 |",
        "| tokens per target forward | 2.25 |",
        "| new tokens / rounds | 9 / 3 |",
        "| reply written by accepted drafts | 56% |",
        "Finished (max new tokens reached)",
    ):
        assert expected in text, expected
    assert "baseline" not in text
    with_baseline = stats_markdown(stats, baseline_tps=10.0)
    assert "| vanilla baseline (measured) | 10.0 tokens/s |" in with_baseline
    assert "| decode speedup over baseline | 2.67× |" in with_baseline  # 26.7 / 10
    assert "speedup" not in stats_markdown(stats, baseline_tps=10.0, mode="vanilla")


def test_slow_reply_hint_reads_as_a_sentence() -> None:
    rounds = scripted_rounds()
    summary = dataclasses.replace(
        summary_of(rounds, "eos"), hint="drafting took 37% of the round time"
    )
    text = stats_markdown(fold([*rounds, Finished("r", summary)]))
    assert "Why not faster: drafting took 37% of the round time." in text


def test_empty_stats_render_placeholders() -> None:
    text = stats_markdown(LiveStats())
    assert "| avg acceptance length (τ) | – |" in text
    assert "| last acceptance length | – |" in text
    assert acceptance_frame(LiveStats()).empty
    waiting = LiveStats(waiting=True)
    assert "Waiting for the model" in stats_markdown(waiting)
    waiting.update(Started("r", "eagle", 3))
    assert "Waiting" not in stats_markdown(waiting)


def test_acceptance_and_race_frames() -> None:
    eagle, vanilla = fold(scripted_rounds()), fold(scripted_rounds(vanilla=True))
    frame = acceptance_frame(eagle)
    assert list(frame.columns) == ["round", "acceptance length"]
    assert frame["acceptance length"].tolist() == [3, 1, 4]
    race = race_frame(vanilla, eagle)
    assert set(race["lane"]) == {"vanilla", "EAGLE"}
    assert race[race["lane"] == "EAGLE"]["tokens"].tolist() == [0, 1, 4, 5, 9]
    assert race[race["lane"] == "vanilla"]["seconds"].tolist() == pytest.approx(
        [0, 0.1, 0.2, 0.3, 0.4]
    )
    assert len(race_frame(LiveStats(), LiveStats())) == 2  # the origins: never empty


def _race(vanilla_text: str, eagle_text: str, divergence: int | None, stop: str = "eos"):
    rounds = scripted_rounds()
    base = summary_of(rounds, stop)
    vanilla = dataclasses.replace(base, text=vanilla_text, tokens_per_s=40.0)
    eagle = dataclasses.replace(base, text=eagle_text, tokens_per_s=100.0)
    return RaceFinished(
        vanilla=vanilla,
        eagle=eagle,
        speedup=2.5,
        identical=divergence is None,
        first_divergence=divergence,
    )


def test_race_verdict_identical() -> None:
    text = race_verdict_markdown(_race("same text", "same text", None))
    assert "EAGLE speedup: 2.50×" in text
    assert "100.0 tokens/s" in text and "40.0 tokens/s" in text
    assert "Identical output" in text and "same 9 tokens" in text
    assert "differ" not in text


def test_race_verdict_names_the_first_divergence() -> None:
    text = race_verdict_markdown(_race("The cat sat on the mat", "The cat sat on a hat", 4))
    assert "Outputs differ" in text and "token #4" in text
    assert "`The cat sat on ⟦the mat⟧`" in text
    assert "`The cat sat on ⟦a hat⟧`" in text
    assert "temperature" not in text  # greedy: no excuse offered
    sampled = race_verdict_markdown(_race("a", "b", 0), temperature=0.7)
    assert "temperature 0.7" in sampled
    stopped = race_verdict_markdown(_race("x", "x", None, stop="cancelled"))
    assert "(stopped early)" in stopped


def test_error_messages_carry_message_and_hint() -> None:
    failed = GenerationFailed("r", "no_model", "no model is loaded", "load a target first")
    assert error_markdown(failed) == "⚠ **no model is loaded** — load a target first"
    assert error_text(failed) == "no model is loaded (load a target first)"
    bare = LoadFailed("internal", "loading failed: boom")
    assert error_markdown(bare) == "⚠ **loading failed: boom**"
    assert error_text(bare) == "loading failed: boom"
    stats = fold([*scripted_rounds()[:2], failed])
    assert stats.done and "no model is loaded" in stats_markdown(stats)


def test_progress_lines() -> None:
    assert (
        progress_text(Progress("download", 1_500_000, 3_000_000, "bytes", "model.safetensors"))
        == "download: 1.5 MB / 3.0 MB (50%) — model.safetensors"
    )
    assert progress_text(Progress("load", 1, 3, "steps")) == "load: 1 / 3 steps (33%)"
    assert progress_text(Progress("resolve", 2, None, "files")) == "resolve: 2 / ? files"
    bar = progress_html(Progress("download", 1, 4, "files", "<b>x</b>"))
    assert '<progress value="0.250" max="1"' in bar and "&lt;b&gt;x&lt;/b&gt;" in bar
    assert "<b>" not in bar
    assert "value=" not in progress_html(Progress("resolve", 2, None, "files"))  # indeterminate


def test_plan_and_pair_info() -> None:
    plan = FakeBackend().plan("org/target", "./head", "auto", "4bit")
    text = plan_markdown(plan)
    assert "| target | 2.0 GB | 500.0 MB | Hub |" in text
    assert "| head | 40.0 MB | 40.0 MB | local folder |" in text
    assert "**To download:** 1.5 GB" in text
    assert "≈ 4.0 GB" in text and "float32, 4bit" in text
    assert "Gated target" in text
    assert "No model loaded" in pair_info_markdown(None)
    info = pair_info_markdown(make_info("org/t", "org/h"))
    assert "`org/t`" in info and "org/h (eagle3)" in info and "1.0M params" in info
    assert "plain completion" not in info
    base = replace(make_info("org/base", None), prompt_format="plain completion")
    assert "plain completion" in pair_info_markdown(base)
    lowered = pair_info_markdown(replace(make_info("org/t", "org/h"), head_dtype="bfloat16"))
    assert "org/h (eagle3, drafting in bfloat16)" in lowered and "float32" in lowered


def test_lane_markdown_and_message_text() -> None:
    eagle = fold(scripted_rounds())
    assert lane_markdown(eagle, "EAGLE").startswith("**EAGLE: 22.5 tokens/s** · 9 tokens · τ 2.67")
    assert "τ" not in lane_markdown(fold(scripted_rounds(vanilla=True)), "vanilla")
    assert message_text("plain") == "plain"
    assert message_text([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]) == "ab"


def test_half_precision_divergence_is_explained_not_a_bug() -> None:
    race = _race("The cat sat on the mat", "The cat sat on a hat", 4)
    text = race_verdict_markdown(race, temperature=0.0, dtype="bfloat16")
    assert "first differ at token #4" in text  # where, as in float32
    assert "- vanilla: `The cat sat on ⟦the mat⟧`" in text
    assert ROUNDING_NOTE.format(dtype="bfloat16") in text and "float32 guarantee" in text
    # In float32 a divergence is a real bug: no excuse is offered.
    assert "not a bug" not in race_verdict_markdown(race, temperature=0.0, dtype="float32")
    identical = _race("same text", "same text", None)
    assert "not a bug" not in race_verdict_markdown(identical, temperature=0.0, dtype="bfloat16")


def test_sizes_read_in_decimal_units_like_the_hubs() -> None:
    assert format_bytes(None) == "?"
    assert format_bytes(999) == "999 B"
    assert format_bytes(1500) == "1.5 kB"
    assert format_bytes(2_500_000_000) == "2.5 GB"
    assert format_bytes(3.2e12) == "3.2 TB"
