"""The Backend facade: load events and failures, race, plan sizes, downloads, vanilla speed."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from backend.api import Backend, ProgressLog
from backend.config import LoadConfig, SamplingConfig
from backend.errors import HubError
from backend.events import (
    Downloaded,
    Finished,
    GenerationFailed,
    Loaded,
    LoadFailed,
    Progress,
    RaceFinished,
    RaceUpdate,
    RoundCompleted,
    first_divergence,
)
from tests.services.conftest import SavedPairs, greedy
from tests.services.test_hub_offline import build_cache

MESSAGES = [{"role": "user", "content": "hello world"}]


@pytest.fixture(scope="module")
def backend(saved_pairs: SavedPairs) -> Backend:
    backend = Backend()
    events = list(backend.load(LoadConfig(str(saved_pairs.target), str(saved_pairs.head))))
    assert isinstance(events[-1], Loaded), events[-1]
    return backend


def test_load_streams_progress_then_loaded(saved_pairs: SavedPairs) -> None:
    backend = Backend()
    events = list(backend.load(LoadConfig(str(saved_pairs.target), str(saved_pairs.head))))
    progress = [e for e in events if isinstance(e, Progress)]
    assert events[:-1] == progress and isinstance(events[-1], Loaded)
    stages = [e.stage for e in progress]
    assert stages[0] == "resolve" and stages[-1] == "warmup" and "load" in stages
    assert any("weights need about" in e.message for e in progress)  # estimate before loading
    info = events[-1].info
    assert (info.head_kind, info.architecture, info.dtype) == (
        "eagle1",
        "LlamaForCausalLM",
        "float32",
    )
    assert info.vocab_size == 300 and info.max_context == 512
    assert backend.status().loaded == info and not backend.status().busy


def test_load_failures_are_events_and_keep_the_loaded_pair(
    backend: Backend, saved_pairs: SavedPairs, tmp_path: Path
) -> None:
    before = backend.status().loaded
    bad_path = list(backend.load(LoadConfig(str(tmp_path / "no-such-model"))))
    assert isinstance(bad_path[-1], LoadFailed), bad_path[-1]
    assert bad_path[-1].code == "config" and "no-such-model" in bad_path[-1].message

    mismatched = list(
        backend.load(LoadConfig(str(saved_pairs.target), str(saved_pairs.foreign_head)))
    )
    failure = mismatched[-1]
    assert isinstance(failure, LoadFailed) and failure.code == "incompatible_head"
    assert "vocabulary size: head 1000 vs target 300" in failure.message and failure.hint
    assert backend.status().loaded == before  # validation fails before the old pair is freed

    empty = tmp_path / "empty"
    empty.mkdir()
    no_config = list(backend.load(LoadConfig(str(empty))))
    assert isinstance(no_config[-1], LoadFailed) and "config.json" in no_config[-1].message


def test_race_at_temperature_zero_is_identical_and_streams_both_lanes(backend: Backend) -> None:
    assert_identical_race(backend)


def assert_identical_race(backend: Backend) -> None:
    """A greedy race of 24 tokens on the loaded easy pair: identical lanes, drafts accepted,
    both lanes streamed interleaved and timed by their own compute."""
    events = list(backend.race(MESSAGES, greedy(24)))
    result = events[-1]
    assert isinstance(result, RaceFinished), result
    assert result.identical and result.first_divergence is None
    assert result.vanilla.token_ids == result.eagle.token_ids and len(result.eagle.token_ids) == 24
    assert result.eagle.tau > 1.5 and result.vanilla.tau == 1.0
    assert result.speedup == pytest.approx(result.eagle.tokens_per_s / result.vanilla.tokens_per_s)

    updates = [e for e in events[:-1] if isinstance(e, RaceUpdate)]
    assert len(updates) == len(events) - 1
    lanes_before_first_finish = set()
    for update in updates:
        if isinstance(update.event, Finished):
            break
        lanes_before_first_finish.add(update.lane)
    assert lanes_before_first_finish == {"vanilla", "eagle"}  # interleaved, not one after the other

    for lane, summary in (("vanilla", result.vanilla), ("eagle", result.eagle)):
        rounds = [
            u.event for u in updates if u.lane == lane and isinstance(u.event, RoundCompleted)
        ]
        compute = sum(r.draft_s + r.verify_s + r.bookkeeping_s for r in rounds)
        assert summary.total_s == pytest.approx(compute)  # own compute only, not wall time
        assert rounds[-1].elapsed_s == pytest.approx(compute)
        assert summary.tokens_per_s == pytest.approx(summary.new_tokens / compute)


def test_race_with_sampling_reports_the_first_divergence(backend: Backend) -> None:
    config = dataclasses.replace(greedy(24), sampling=SamplingConfig(temperature=4.0, seed=7))
    result = list(backend.race(MESSAGES, config))[-1]
    assert isinstance(result, RaceFinished), result
    assert not result.identical
    index = result.first_divergence
    assert index is not None
    assert result.vanilla.token_ids[:index] == result.eagle.token_ids[:index]
    assert result.vanilla.token_ids[index] != result.eagle.token_ids[index]


def test_first_divergence_rules() -> None:
    assert first_divergence((1, 2, 3), (1, 2, 3)) is None
    assert first_divergence((1, 2, 3), (1, 5, 3)) == 1
    assert first_divergence((1, 2), (1, 2, 3)) == 2
    assert first_divergence((), ()) is None
    # the same rule on text: where the race verdict points in the two replies
    assert first_divergence("abc", "abc") is None
    assert first_divergence("abc", "abd") == 2
    assert first_divergence("ab", "abc") == 2


def test_a_race_without_a_head_drafts_from_the_context(saved_pairs: SavedPairs) -> None:
    backend = Backend()
    list(backend.load(LoadConfig(str(saved_pairs.other_target))))
    events = list(backend.race(MESSAGES, greedy(8)))
    assert isinstance(events[-1], RaceFinished), events[-1]
    assert events[-1].identical
    head_only = dataclasses.replace(greedy(8), drafts="head")
    events = list(backend.race(MESSAGES, head_only))
    assert len(events) == 1 and isinstance(events[0], GenerationFailed)
    assert "needs a draft head" in events[0].message


def test_nothing_loaded_is_an_event_not_an_exception() -> None:
    backend = Backend()
    (event,) = list(backend.stream(MESSAGES, greedy(8)))
    assert isinstance(event, GenerationFailed) and event.code == "no_model"
    assert backend.vanilla_speed() is None
    assert backend.status().loaded is None


def test_plan_sizes_of_a_local_pair(backend: Backend, saved_pairs: SavedPairs) -> None:
    plan = backend.plan(str(saved_pairs.target), str(saved_pairs.head))
    on_disk = sum(p.stat().st_size for p in saved_pairs.target.iterdir())
    assert plan.target.total_bytes == plan.target.cached_bytes == on_disk
    assert plan.target.source == "local" and plan.head is not None
    assert plan.head.total_bytes == sum(p.stat().st_size for p in saved_pairs.head.iterdir())
    assert plan.bytes_to_download == 0 and plan.ready
    pair = backend.pair
    assert pair is not None and pair.head is not None
    assert plan.parameters_source == "safetensors"
    assert plan.parameters == pair.model.num_parameters()
    assert plan.head_parameters == sum(p.numel() for p in pair.head.parameters())
    assert plan.memory_bytes == 4 * (plan.parameters + plan.head_parameters)  # float32 on CPU
    config = pair.model.config
    assert (
        plan.kv_bytes_per_token
        == 2 * config.num_hidden_layers * config.num_key_value_heads * 16 * 4
    )


def test_plan_download_and_load_of_a_cached_hub_id(
    saved_pairs: SavedPairs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    files = {p.name: p.read_bytes() for p in saved_pairs.target.iterdir()}
    snapshot = build_cache(cache, "org/tiny", files)
    backend = Backend()

    plan = backend.plan("org/tiny", dtype="bfloat16", quantization="none")
    assert plan.target.source == "hub" and plan.target.from_cache and plan.offline and plan.ready
    assert plan.memory_bytes == 2 * plan.parameters

    (done,) = list(backend.download("org/tiny", str(saved_pairs.head)))
    assert done == Downloaded(target_path=str(snapshot), head_path=str(saved_pairs.head))
    events = list(backend.load(LoadConfig("org/tiny")))
    assert isinstance(events[-1], Loaded) and events[-1].info.target == "org/tiny"

    with pytest.raises(HubError) as info:
        backend.plan("org/never-downloaded")
    assert info.value.code == "not_cached"
    failed = list(backend.download("org/never-downloaded", None))
    assert isinstance(failed[-1], LoadFailed) and failed[-1].code == "not_cached"


def test_vanilla_speed_is_measured_once_per_pair(saved_pairs: SavedPairs) -> None:
    backend = Backend()
    list(backend.load(LoadConfig(str(saved_pairs.target))))
    speed = backend.vanilla_speed()
    assert speed is not None and speed > 0
    assert backend.vanilla_speed() == speed  # cached
    list(backend.load(LoadConfig(str(saved_pairs.other_target))))
    assert backend.vanilla_speed() != speed  # measured again for the new pair
    backend.unload()
    assert backend.status().loaded is None and backend.vanilla_speed() is None


def test_vanilla_estimate_comes_from_calibration_only(saved_pairs: SavedPairs) -> None:
    backend = Backend()
    assert backend.estimated_vanilla_speed() is None  # nothing loaded
    for head in (None, str(saved_pairs.head)):  # without a head, calibrated for context drafts
        list(backend.load(LoadConfig(str(saved_pairs.target), head)))
        costs = backend.pair.engine.costs  # calibrated while loading, before any reply
        assert costs is not None
        assert backend.estimated_vanilla_speed() == pytest.approx(1.0 / costs.verify(1))
    backend.unload()
    assert backend.estimated_vanilla_speed() is None


def test_unload_frees_the_pair(saved_pairs: SavedPairs, tmp_path: Path) -> None:
    backend = Backend()
    list(backend.load(LoadConfig(str(saved_pairs.other_target))))
    backend.unload()
    (event,) = list(backend.stream(MESSAGES, greedy(4, "vanilla")))
    assert isinstance(event, GenerationFailed) and event.code == "no_model"
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_the_load_log_keeps_a_long_stage_to_a_few_lines() -> None:
    """The CLI's load log: one line per new message, a long counted stage at most once per
    tenth (or per interval) and at its end, however many events it sends."""
    lines: list[str] = []
    clock = [0.0]
    log = ProgressLog(
        lambda fmt, *args: lines.append(fmt % args), every_s=5.0, clock=lambda: clock[0]
    )
    log(Progress("load", 1, 5, "steps", "tokenizer"))
    log(Progress("load", 2, 5, "steps", "target float32 weights"))
    for done in range(1, 251):
        clock[0] += 0.001
        log(Progress("calibrate", done, 250, "steps", "timing tree verification"))
    assert lines[:3] == ["tokenizer", "target float32 weights", "timing tree verification"]
    assert lines[-1] == "timing tree verification (100%)"
    assert 10 <= len(lines) <= 14  # every tenth, not 250 lines
    clock[0] += 6.0  # a slow stage still says where it is every interval
    log(Progress("calibrate", 1, 1000, "steps", "teaching the tree tuner"))
    log(Progress("calibrate", 2, 1000, "steps", "teaching the tree tuner"))
    clock[0] += 6.0
    log(Progress("calibrate", 3, 1000, "steps", "teaching the tree tuner"))
    assert lines[-2:] == ["teaching the tree tuner", "teaching the tree tuner (0%)"]
