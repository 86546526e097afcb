"""Load-time calibration: what it measures, its progress, and that timing leaves no trace in
the caches it borrows (no timing thresholds)."""

from __future__ import annotations

import pytest
import torch

from backend.config import TreeConfig
from backend.engine import calibration, kv
from backend.engine.autotune import HEAD_SHAPES
from backend.engine.calibration import (
    MEASURED_SIZES,
    CostModel,
    RoundThreads,
    calibrate,
    calibration_steps,
    fastest_round_threads,
    measure_costs,
    thread_counts,
)
from tests.engine.helpers import make_runner
from tests.factories import tiny_head, tiny_target


def test_calibration_reports_progress_and_times_trees_and_chains() -> None:
    target = tiny_target()
    runner, drafter = make_runner(target, tiny_head("eagle3", target))
    shapes = HEAD_SHAPES[:3] + HEAD_SHAPES[-2:]
    steps = calibrate(runner, drafter, shapes, context=16, repeats=2)
    progress = []
    while True:
        try:
            progress.append(next(steps))
        except StopIteration as finished:
            costs = finished.value
            break
    expected = calibration_steps(has_drafter=True, shapes=shapes, repeats=2)
    assert progress == list(range(1, expected + 1))
    assert sorted(costs.verify_s) == sorted(costs.chain_verify_s) == list(MEASURED_SIZES)
    for table in (costs.verify_s, costs.chain_verify_s):
        values = [table[n] for n in MEASURED_SIZES]
        assert all(v > 0 for v in values) and values == sorted(values)
    assert costs.draft_step_s > 0 and costs.chain_step_s > 0
    assert sorted(costs.rounds_s) == sorted(s.label() for s in shapes)
    assert all(costs.round_s(s) == costs.rounds_s[s.label()] > 0 for s in shapes)


def test_a_timed_round_overrides_the_sum_of_its_parts() -> None:
    """A shape timed as a whole round is priced as timed (drafting bookkeeping included), as
    calibration measured it; the others as verification plus draft steps."""
    timed, untimed = TreeConfig(16, 5, 4), TreeConfig(8, 4, 2)
    costs = CostModel({1: 1.0, 8: 2.0, 16: 3.0}, draft_step_s=0.5, rounds_s={"16/5/4": 9.0})
    assert costs.round_s(timed) == 9.0 and costs.round_s(untimed) == 2.0 + 4 * 0.5
    assert CostModel.from_json(costs.to_json()) == costs


def test_round_cost_uses_the_chain_table_for_chains() -> None:
    costs = CostModel(
        verify_s={1: 1.0, 4: 3.0},
        chain_verify_s={1: 1.0, 4: 2.0},
        draft_step_s=0.5,
        chain_step_s=0.25,
    )
    assert costs.round_s(TreeConfig(total_tokens=4, depth=3, top_k=1)) == 2.0 + 3 * 0.25
    assert costs.round_s(TreeConfig(total_tokens=4, depth=2, top_k=2)) == 3.0 + 2 * 0.5
    assert costs.verify_ratio(4, chain=True) == 2.0
    assert CostModel.from_json(costs.to_json()) == costs


def test_costs_without_a_chain_table_fall_back_to_the_tree_table() -> None:
    old = CostModel.from_json({"verify_s": {"1": 1.0, "8": 2.0}, "draft_step_s": 0.1})
    assert old.verify(8, chain=True) == old.verify(8) == 2.0


def test_calibration_leaves_the_model_usable_for_an_identical_generation() -> None:
    """Timing runs cut the borrowed cache back after every forward; the engine's own outputs
    afterwards are the same as before calibrating."""
    target = tiny_target()
    runner, drafter = make_runner(target, tiny_head("eagle3", target))
    prompt = torch.arange(5, 21)
    cache = runner.new_cache()
    before = runner.prefill(prompt, cache, with_features=False).logits[-1]
    measure_costs(runner, drafter, HEAD_SHAPES[:2], context=8, repeats=1)
    cache = runner.new_cache()
    after = runner.prefill(prompt, cache, with_features=False).logits[-1]
    assert torch.equal(before, after)
    assert kv.cache_length(cache) == prompt.numel()


@pytest.mark.parametrize("shape", [TreeConfig(16, 5, 4), TreeConfig(7, 6, 1)])
def test_a_timed_round_keeps_and_feeds_back_a_whole_path(monkeypatch, shape) -> None:
    """A timed round pays what a round whose drafts hold pays, whatever the prompt of zeros
    accepted: the deepest path's cache entries kept (in a branching tree, gathered from apart
    from the root's slot) and all its tokens fed back to the head."""
    target = tiny_target()
    runner, drafter = make_runner(target, tiny_head("eagle3", target))
    trees, kept, fed = [], [], []
    verify, keep_entries, commit = runner.verify, kv.keep_tree_entries, drafter.commit

    def spy_verify(tree, cache, with_features):
        trees.append(tree)
        return verify(tree, cache, with_features)

    def spy_keep(cache, committed, keep):
        kept.append(keep.tolist())
        return keep_entries(cache, committed, keep)

    def spy_commit(tokens, features):
        fed.append((list(tokens), features.shape[0]))
        return commit(tokens, features)

    monkeypatch.setattr(runner, "verify", spy_verify)
    monkeypatch.setattr(calibration.kv, "keep_tree_entries", spy_keep)
    monkeypatch.setattr(drafter, "commit", spy_commit)
    with torch.inference_mode():
        prompt, cache, step = calibration._prefilled(runner, 8, with_features=True)
        calibration._time_round(runner, drafter, cache, prompt, step, shape)
    (tree,), (path,) = trees, kept
    parents, depths = tree.parents.tolist(), tree.depths.tolist()
    assert path[0] == 0 and all(parents[b] == a for a, b in zip(path, path[1:]))
    assert len(path) - 1 == depths[path[-1]] == max(depths) >= 2  # root to the deepest node
    assert (path != list(range(len(path)))) == (shape.top_k > 1)  # a gather, or a cut
    assert [(len(tokens), rows) for tokens, rows in fed] == [(len(path), len(path))]
    assert fed[0][0][:-1] == tree.token_ids[path[1:]].tolist()  # the path's drafts, then a bonus
    assert kv.cache_length(cache) == prompt.numel()  # cut back afterwards


@pytest.mark.parametrize(
    ("available", "counts"),
    [(1, [1]), (2, [1, 2]), (6, [1, 2, 4, 6]), (16, [1, 2, 4, 8, 16])],
)
def test_thread_counts_timed_are_one_the_powers_of_two_and_all(available, counts) -> None:
    assert thread_counts(available) == counts


def forwards_timed_by_threads(
    monkeypatch, round_s: dict[int, float], plain_s: dict[int, float]
) -> list[tuple[str, int]]:
    """Make every timed round take ``round_s[threads]`` and every plain step ``plain_s[threads]``;
    returns what was timed at which thread count."""
    seen = []

    def fake_round(*args) -> float:
        seen.append(("round", torch.get_num_threads()))
        return round_s[torch.get_num_threads()]

    def fake_plain(*args) -> float:
        seen.append(("plain", torch.get_num_threads()))
        return plain_s[torch.get_num_threads()]

    monkeypatch.setattr(calibration, "_time_round", fake_round)
    monkeypatch.setattr(calibration, "_time_verify", fake_plain)
    return seen


def runner_and_drafter():
    target = tiny_target()
    return make_runner(target, tiny_head("eagle3", target))


def test_plain_steps_and_rounds_each_get_their_fastest_thread_count(
    four_threads, monkeypatch
) -> None:
    seen = forwards_timed_by_threads(
        monkeypatch, round_s={1: 0.004, 2: 0.003, 4: 0.005}, plain_s={1: 0.003, 2: 0.002, 4: 0.001}
    )
    threads = fastest_round_threads(*runner_and_drafter(), context=8, repeats=2)
    assert threads == RoundThreads(plain=4, drafted=2)
    assert threads.of(drafted=True) == 2 and threads.of(drafted=False) == 4
    assert {count for kind, count in seen if kind == "round"} == {1, 2, 4}
    assert {count for kind, count in seen if kind == "plain"} == {1, 2, 4}
    assert torch.get_num_threads() == 4  # the process keeps its own count


def test_fewer_threads_must_be_clearly_faster(four_threads, monkeypatch) -> None:
    near = {1: 0.0099, 2: 0.0099, 4: 0.01}
    forwards_timed_by_threads(monkeypatch, round_s=near, plain_s=near)
    threads = fastest_round_threads(*runner_and_drafter(), context=8, repeats=2)
    assert threads == RoundThreads(4, 4)


def test_a_compute_bound_round_keeps_every_thread_untimed(four_threads, monkeypatch) -> None:
    slow = 2 * calibration.COMPUTE_BOUND_ROUND_S
    timings = {1: slow / 4, 2: slow / 2, 4: slow}
    seen = forwards_timed_by_threads(monkeypatch, round_s=timings, plain_s=timings)
    assert fastest_round_threads(*runner_and_drafter(), context=8, repeats=2) == RoundThreads(4, 4)
    assert seen == [("round", 4)]


def test_without_a_drafter_every_thread_is_kept_untimed(four_threads, monkeypatch) -> None:
    seen = forwards_timed_by_threads(monkeypatch, round_s={}, plain_s={})
    runner, _ = make_runner(tiny_target())
    assert fastest_round_threads(runner, None, context=8, repeats=1) == RoundThreads(4, 4)
    assert not seen


def test_round_threads_round_trip_through_json() -> None:
    threads = RoundThreads(plain=2, drafted=1)
    assert RoundThreads.from_json(threads.to_json()) == threads
    assert RoundThreads.from_json(None) is None
    assert RoundThreads.from_json({"plain": 2, "drafted": 0}) is None


def test_costs_are_timed_on_the_thread_counts_each_kind_of_round_runs_on(
    four_threads, monkeypatch
) -> None:
    runner, drafter = runner_and_drafter()
    seen: list[tuple[str, int]] = []
    timed_verify = calibration._time_verify

    def spy_verify(runner, cache, tree):
        seen.append(("plain" if tree.size == 1 else "forward", torch.get_num_threads()))
        return timed_verify(runner, cache, tree)

    monkeypatch.setattr(calibration, "_time_verify", spy_verify)
    costs = measure_costs(
        runner, drafter, HEAD_SHAPES[:2], context=8, repeats=1, threads=RoundThreads(2, 1)
    )
    assert costs.verify(1) > 0
    assert {count for kind, count in seen if kind == "plain"} == {2}
    assert {count for kind, count in seen if kind == "forward"} == {1}
    assert torch.get_num_threads() == 4
