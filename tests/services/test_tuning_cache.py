"""What the tree auto-tuner learned, kept across launches: a second load of the same pair starts
from the first one's estimates (its first reply then skips the prior), and a damaged or
foreign entry only means starting afresh."""

from __future__ import annotations

import gc
import json
import logging

import pytest

from backend.api import Backend
from backend.config import GenerationConfig, LoadConfig, TreeConfig
from backend.engine.autotune import LADDER, TreePolicy
from backend.engine.calibration import MEASURED_SIZES, CostModel
from backend.engine.progress import drain
from backend.errors import EagleChatError
from backend.services import loading, tuning_cache
from backend.services.cache_home import cache_home
from backend.services.loading import load_steps, prepare

COSTS = CostModel({n: 0.005 * (1 + 0.1 * (n - 1)) for n in MEASURED_SIZES}, draft_step_s=0.0005)


def taught(policy: TreePolicy, rounds: int = 60) -> TreePolicy:
    """Rounds where the head's first guess holds at depths 1-3 and fails at depth 4, the
    second guess holding at depth 4; each round is timed at 1.3x its calibrated cost."""
    for _ in range(rounds):
        shape = policy.choose() or LADDER[0]
        accepted = min(shape.depth, 4 if shape.top_k > 1 else 3)
        outcomes = [(0, 2)] * min(accepted, 3) + ([(1, 2)] if accepted > 3 else [])
        outcomes += [(None, 2)] if accepted < shape.depth else []
        replayed = {s: min(s.depth, 4 if s.top_k > 1 else 3) for s in policy.covered_shapes(shape)}
        policy.observe(shape, accepted, replayed, outcomes)
        policy.observe_time(shape, 1.3 * COSTS.round_s(shape))
    return policy


def test_a_restored_policy_prices_every_shape_as_the_saved_one() -> None:
    old = taught(TreePolicy(COSTS))
    new = TreePolicy(COSTS)
    new.restore(json.loads(json.dumps(old.learned())))
    assert new.best_tree() == old.best_tree() != TreePolicy(COSTS).best_tree()
    for shape in LADDER:
        assert new.expected_tokens(shape) == pytest.approx(old.expected_tokens(shape))
        assert new.round_s(shape) == pytest.approx(old.round_s(shape))
    assert new.seen == old.seen and new.rates == old.rates


def test_time_factors_are_left_out_when_the_costs_were_timed_again() -> None:
    old = taught(TreePolicy(COSTS))
    new = TreePolicy(COSTS)
    new.restore(old.learned(), with_times=False)
    assert new.rates == old.rates
    assert new.round_s(LADDER[5]) == pytest.approx(COSTS.round_s(LADDER[5]))
    assert old.round_s(LADDER[5]) > 1.2 * COSTS.round_s(LADDER[5])


def test_state_of_another_form_changes_nothing() -> None:
    state = taught(TreePolicy(COSTS)).learned()
    state["rates"] = state["rates"][:3]
    policy = TreePolicy(COSTS)
    before = policy.learned()
    with pytest.raises(ValueError):
        policy.restore(state)
    assert policy.learned() == before


def load(root):
    config = LoadConfig(target=str(root / "target"), head=str(root / "head"), dtype="float32")
    return drain(load_steps(prepare(config, str(root / "target"), str(root / "head"))))


@pytest.fixture
def no_lesson(monkeypatch) -> None:
    """Loads without the tuner's lesson: what replies teach and what is saved, on its own."""

    def skip(engine, prompt_format):
        return 0, 0.0
        yield

    monkeypatch.setattr(loading, "teach_tuner", skip)


def reply(pair) -> None:
    config = GenerationConfig(max_new_tokens=24, tree=TreeConfig(auto=True), stop_on_eos=False)
    for _ in pair.engine.generate([1, 5, 9, 13], config):
        pass


def test_a_second_load_starts_from_what_the_first_learned(pair_on_disk, no_lesson) -> None:
    first = load(pair_on_disk)
    assert first.engine.policies == {} and not first.tuning_restored  # nothing saved: the prior
    reply(first)
    learned = first.engine.policies[False]
    assert learned.seen[0] > 0
    tuning_cache.save(first.engine.policies, first.tuning_key)
    second = load(pair_on_disk)
    restored = second.engine.policies[False]
    assert second.tuning_restored and restored is not learned
    assert restored.seen == learned.seen and restored.rates == learned.rates
    assert restored.time_scale.overall == learned.time_scale.overall  # costs read from cache


def test_a_damaged_entry_is_ignored_with_a_warning(pair_on_disk, caplog, no_lesson) -> None:
    first = load(pair_on_disk)
    reply(first)
    tuning_cache.save(first.engine.policies, first.tuning_key)
    (entry,) = (cache_home() / "tuning").glob("*.json")
    entry.write_text('{"greedy": {"rates": [0.5]}}')
    with caplog.at_level(logging.WARNING):
        second = load(pair_on_disk)
    assert second.engine.policies == {}
    assert "ignoring the unreadable tuning state" in caplog.text
    reply(second)  # and the pair works, from the prior
    assert second.engine.policies[False].seen[0] > 0


def test_what_a_run_learned_is_saved_at_exit_even_once_its_engine_is_gone(
    pair_on_disk, no_lesson
) -> None:
    """A command-line run drops its pair before the process ends: the exit hook keeps only
    the policies, and saves them."""
    first = load(pair_on_disk)
    reply(first)
    seen = list(first.engine.policies[False].seen)
    del first
    gc.collect()
    assert not (cache_home() / "tuning").exists()
    tuning_cache._save_all()  # what the exit hook runs
    second = load(pair_on_disk)
    assert second.engine.policies[False].seen == seen


def test_the_loaded_pair_says_where_its_tuner_started(pair_on_disk, no_lesson) -> None:
    first = load(pair_on_disk)
    assert first.info.tree_tuning == "new"
    reply(first)
    tuning_cache.save(first.engine.policies, first.tuning_key)
    assert load(pair_on_disk).info.tree_tuning == "resumed"


def test_a_first_load_teaches_the_tuner_and_the_next_load_resumes_it(pair_on_disk) -> None:
    """With nothing saved, a short greedy reply at load teaches the tuner (progress shown as
    calibration, ending full) and is saved at once: a second load resumes, teaching nothing."""
    config = LoadConfig(
        target=str(pair_on_disk / "target"), head=str(pair_on_disk / "head"), dtype="float32"
    )
    events: list = []
    steps = load_steps(prepare(config, str(pair_on_disk / "target"), str(pair_on_disk / "head")))
    first = drain(steps, events.append)
    lesson = [e for e in events if "teaching the tree tuner" in e.message]
    assert lesson and lesson[-1].done == lesson[-1].total and events[-1].message == "ready"
    policy = first.engine.policies[False]
    assert first.info.tree_tuning == "taught" and not first.tuning_restored
    assert first.tuning_lesson_rounds >= policy.seen[0] > 0 and first.calibration_s > 0
    second = load(pair_on_disk)
    assert second.info.tree_tuning == "resumed" and second.tuning_lesson_rounds == 0
    assert second.engine.policies[False].seen == policy.seen


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
    assert policies[False].seen[0] > 0
    backend.reset_tuning()
    assert pair.engine.policies is policies and policies == {}  # what the exit hook saves
    assert not list((cache_home() / "tuning").glob("*.json"))
    assert backend.status().loaded.tree_tuning == "new"
    reply(pair)  # the next reply learns from the prior again
    assert pair.engine.policies[False].seen[0] > 0
    backend.unload()  # saves what it learned since the reset
    assert backend.load_blocking(config).info.tree_tuning == "resumed"


def test_a_reset_needs_a_loaded_head(pair_on_disk) -> None:
    backend = Backend()
    with pytest.raises(EagleChatError, match="no model is loaded"):
        backend.reset_tuning()
    backend.load_blocking(LoadConfig(target=str(pair_on_disk / "target"), dtype="float32"))
    with pytest.raises(EagleChatError, match="no draft head"):
        backend.reset_tuning()
