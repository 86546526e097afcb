"""What the round auto-tuner learned, kept across launches: a second load of the same pair starts
from the first one's estimates (its first reply then skips the prior), and a damaged or
foreign entry only means starting afresh. (Round trips of the state itself: test_autotune.py.)"""

from __future__ import annotations

import gc
import logging

import pytest

from backend.api import Backend
from backend.config import GenerationConfig, LoadConfig, TreeConfig
from backend.engine.progress import drain
from backend.errors import EagleChatError
from backend.services import tuning_cache
from backend.services.cache_home import cache_home
from backend.services.loading import load_steps, prepare

GREEDY = (False, "both")  # the policy a default greedy reply uses


def load(root):
    config = LoadConfig(target=str(root / "target"), head=str(root / "head"), dtype="float32")
    return drain(load_steps(prepare(config, str(root / "target"), str(root / "head"))))


def reply(pair) -> None:
    config = GenerationConfig(max_new_tokens=24, tree=TreeConfig(auto=True), stop_on_eos=False)
    for _ in pair.engine.generate([1, 5, 9, 13], config):
        pass


def test_a_second_load_starts_from_what_the_first_learned(pair_on_disk) -> None:
    first = load(pair_on_disk)
    assert first.engine.policies == {} and not first.tuning_restored  # nothing saved: the prior
    assert first.calibration_s > 0
    reply(first)
    learned = first.engine.policies[GREEDY]
    assert any(stats.seconds.count for stats in learned.stats.values())
    tuning_cache.save(first.engine.policies, first.tuning_key)
    second = load(pair_on_disk)
    restored = second.engine.policies[GREEDY]
    assert second.tuning_restored and restored is not learned
    assert second.calibration_s == 0  # costs read from cache: the saved times still hold
    assert restored.stats == learned.stats and restored.ratio == learned.ratio


@pytest.mark.parametrize(
    "damaged",
    [
        '[[false, "both", {"arms": {"plain": [0.5]}, "ratio": [1, 1, 0]}]]',  # short values
        '[[false, "all", {"arms": {}, "ratio": [1, 1, 0]}]]',  # unknown draft sources
        '{"greedy/both": {"arms": {}, "ratio": [1, 1, 0]}}',  # another layout
    ],
)
def test_a_damaged_entry_is_ignored_with_a_warning(pair_on_disk, caplog, damaged: str) -> None:
    first = load(pair_on_disk)
    reply(first)
    tuning_cache.save(first.engine.policies, first.tuning_key)
    (entry,) = (cache_home() / "tuning").glob("*.json")
    entry.write_text(damaged)
    with caplog.at_level(logging.WARNING):
        second = load(pair_on_disk)
    assert not second.tuning_restored
    assert all(
        not s.seconds.count for p in second.engine.policies.values() for s in p.stats.values()
    )
    assert "ignoring the unreadable tuning state" in caplog.text
    reply(second)  # and the pair works, from the prior
    assert any(s.seconds.count for s in second.engine.policies[GREEDY].stats.values())


def test_what_a_run_learned_is_saved_at_exit_even_once_its_engine_is_gone(pair_on_disk) -> None:
    """A command-line run drops its pair before the process ends: the exit hook keeps only
    the policies, and saves them."""
    first = load(pair_on_disk)
    reply(first)
    learned = first.engine.policies[GREEDY].learned()
    del first
    gc.collect()
    assert not (cache_home() / "tuning").exists()
    tuning_cache._save_all()  # what the exit hook runs
    second = load(pair_on_disk)
    assert second.engine.policies[GREEDY].learned() == learned


def test_the_loaded_pair_says_where_its_tuner_started(pair_on_disk) -> None:
    first = load(pair_on_disk)
    assert first.info.tree_tuning == "new"
    reply(first)
    tuning_cache.save(first.engine.policies, first.tuning_key)
    assert load(pair_on_disk).info.tree_tuning == "resumed"


def test_a_first_load_times_the_round_costs_with_progress(pair_on_disk) -> None:
    config = LoadConfig(
        target=str(pair_on_disk / "target"), head=str(pair_on_disk / "head"), dtype="float32"
    )
    events: list = []
    steps = load_steps(prepare(config, str(pair_on_disk / "target"), str(pair_on_disk / "head")))
    first = drain(steps, events.append)
    timing = [e for e in events if e.stage == "calibrate"]
    assert timing and timing[-1].done == timing[-1].total and events[-1].message == "ready"
    assert first.info.tree_tuning == "new" and first.calibration_s > 0


def test_a_reset_forgets_the_learned_state_here_and_on_disk(pair_on_disk) -> None:
    backend = Backend()
    config = LoadConfig(
        target=str(pair_on_disk / "target"), head=str(pair_on_disk / "head"), dtype="float32"
    )
    pair = backend.load_blocking(config)
    reply(pair)
    tuning_cache.save(pair.engine.policies, pair.tuning_key)
    pair = backend.load_blocking(config)
    assert backend.status().loaded.tree_tuning == "resumed"
    policies = pair.engine.policies
    assert any(s.seconds.count for s in policies[GREEDY].stats.values())
    backend.reset_tuning()
    assert pair.engine.policies is policies and policies == {}  # what the exit hook saves
    assert not list((cache_home() / "tuning").glob("*.json"))
    assert backend.status().loaded.tree_tuning == "new"
    reply(pair)  # the next reply learns from the prior again
    assert any(s.seconds.count for s in pair.engine.policies[GREEDY].stats.values())
    backend.unload()  # saves what it learned since the reset
    assert backend.load_blocking(config).info.tree_tuning == "resumed"


def test_a_reset_needs_a_loaded_pair(pair_on_disk) -> None:
    backend = Backend()
    with pytest.raises(EagleChatError, match="no model is loaded"):
        backend.reset_tuning()
    pair = backend.load_blocking(LoadConfig(target=str(pair_on_disk / "target"), dtype="float32"))
    reply(pair)  # without a head, the context drafts are tuned: resettable too
    backend.reset_tuning()
    assert pair.engine.policies == {}
