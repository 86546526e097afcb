"""Calibration at load, kept on disk: the second load of the same pair reads it back, and any
change to what the costs depend on measures again."""

from __future__ import annotations

import json
import os

import pytest
import torch

from backend.config import LoadConfig
from backend.engine.calibration import RoundThreads
from backend.engine.progress import drain
from backend.engine.projection_forms import form_of
from backend.errors import ConfigError
from backend.services import calibration_cache, loading
from backend.services.cache_home import keep
from backend.services.loading import load_steps, prepare


def load(root, dtype: str = "float32"):
    config = LoadConfig(target=str(root / "target"), head=str(root / "head"), dtype=dtype)
    events = []
    pair = drain(
        load_steps(prepare(config, str(root / "target"), str(root / "head"))), events.append
    )
    return pair, [e for e in events if e.stage == "calibrate"]


def test_first_load_calibrates_with_progress_and_the_second_reads_the_cache(pair_on_disk) -> None:
    first, progress = load(pair_on_disk)
    assert first.engine.costs is not None and first.calibration_s > 0
    assert len(progress) > 10 and progress[-1].done == progress[-1].total
    assert len(list(calibration_cache.cache_dir().glob("*.json"))) == 1
    second, progress = load(pair_on_disk)
    assert second.calibration_s == 0.0
    assert second.engine.costs == first.engine.costs
    assert len(progress) == 1 and "cache" in progress[0].message


def test_the_second_load_runs_the_projection_forms_the_first_chose(pair_on_disk) -> None:
    """Timing the forms again could choose others than the cached costs were measured with."""
    first, _ = load(pair_on_disk)
    (entry,) = calibration_cache.cache_dir().glob("*.json")
    data = json.loads(entry.read_text())
    assert data["forms"]["target"] == {
        "one": form_of(first.model.get_output_embeddings(), many=False),
        "many": form_of(first.model.get_output_embeddings(), many=True),
    }
    data["forms"]["target"] = {"one": "packed", "many": "rows-first"}  # unlikely to be timed so
    entry.write_text(json.dumps(data))
    second, _ = load(pair_on_disk)
    readout = second.model.get_output_embeddings()
    assert second.calibration_s == 0.0
    assert (form_of(readout, many=False), form_of(readout, many=True)) == ("packed", "rows-first")
    assert second.readout_forms.startswith("1 row: packed, more: rows-first")


def test_the_second_load_runs_the_decoder_choices_the_first_made(pair_on_disk) -> None:
    first, _ = load(pair_on_disk)
    (entry,) = calibration_cache.cache_dir().glob("*.json")
    data = json.loads(entry.read_text())
    groups = [name for name in data["forms"] if name.startswith("decoder ") and "+" in name]
    assert groups  # q/k/v and gate/up were timed fused against separate
    for name in groups:  # whatever was timed: fused, packed for several rows
        data["forms"][name] = {"one": "stock", "many": "packed"}
    entry.write_text(json.dumps(data))
    second, _ = load(pair_on_disk)
    assert second.calibration_s == 0.0
    attention = second.model.model.layers[0].self_attn
    product = attention.q_proj.shared_product.product
    assert (form_of(product, many=False), form_of(product, many=True)) == ("stock", "packed")
    assert second.decoder_forms.startswith("fused q_proj+k_proj+v_proj, gate_proj+up_proj")


def test_stock_decoder_forms_leave_the_model_as_loaded(pair_on_disk) -> None:
    config = LoadConfig(
        target=str(pair_on_disk / "target"),
        head=str(pair_on_disk / "head"),
        dtype="float32",
        decoder_forms="stock",
    )
    pair = drain(load_steps(prepare(config, config.target, config.head)))
    linears = [m for m in pair.model.model.layers.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and not any("forward" in m.__dict__ for m in linears)
    assert pair.decoder_forms == "stock"


def test_new_weights_or_another_dtype_measure_again(pair_on_disk) -> None:
    first, _ = load(pair_on_disk)
    weights = next((pair_on_disk / "target").glob("*.safetensors"))
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    second, _ = load(pair_on_disk)
    assert second.calibration_s > 0
    third, _ = load(pair_on_disk, dtype="bfloat16")
    assert third.calibration_s > 0
    assert len(list(calibration_cache.cache_dir().glob("*.json"))) == 3


def scale_cached_costs(factor: float) -> None:
    (entry,) = calibration_cache.cache_dir().glob("*.json")
    data = json.loads(entry.read_text())
    costs = data["costs"]
    for table in ("verify_s", "chain_verify_s", "rounds_s"):
        costs[table] = {size: factor * s for size, s in costs[table].items()}
    costs["draft_step_s"] *= factor
    costs["chain_step_s"] *= factor
    entry.write_text(json.dumps(data))


def test_cached_costs_are_kept_whatever_the_machine_does_now(pair_on_disk) -> None:
    """Cached costs are not timed again at load: they seed the tuner's prices, and the rounds'
    measured times follow the machine from there (autotune.py)."""
    first, _ = load(pair_on_disk)
    scale_cached_costs(0.1)
    again, _ = load(pair_on_disk)
    assert again.calibration_s == 0.0
    assert again.engine.costs.verify(1) == pytest.approx(0.1 * first.engine.costs.verify(1))


def test_a_damaged_cache_entry_is_measured_again(pair_on_disk) -> None:
    load(pair_on_disk)
    (entry,) = calibration_cache.cache_dir().glob("*.json")
    entry.write_text("{not json")
    again, _ = load(pair_on_disk)
    assert again.calibration_s > 0 and again.engine.costs is not None
    key = calibration_cache.calibration_key(
        str(pair_on_disk / "target"),
        str(pair_on_disk / "head"),
        again.engine.runner.device,
        "float32",
        "none",
    )
    assert calibration_cache.load(key).costs == again.engine.costs


def test_an_unwritable_cache_only_means_measuring_again(pair_on_disk, monkeypatch) -> None:
    blocker = pair_on_disk / "blocked"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv("EAGLECHAT_CACHE_DIR", str(blocker))
    first, _ = load(pair_on_disk)
    second, _ = load(pair_on_disk)
    assert first.engine.costs is not None and second.calibration_s > 0


def test_the_head_precision_chosen_at_load_is_kept_and_shown(pair_on_disk, monkeypatch) -> None:
    """Timed once: the next load drafts in the same precision without timing again."""
    from backend.engine import head_precision

    timings = []

    def bfloat16_faster(drafter, prompt, features) -> float:
        timings.append(drafter.dtype)
        return 1.0 if drafter.dtype == torch.bfloat16 else 2.0

    monkeypatch.setattr(head_precision, "can_lower", lambda head: True)
    monkeypatch.setattr(head_precision, "drafting_s", bfloat16_faster)
    first, _ = load(pair_on_disk)
    assert len(timings) == 2
    assert first.head.dtype_device()[0] == torch.bfloat16
    assert first.info.head_dtype == "bfloat16" and first.info.dtype == "float32"
    (entry,) = calibration_cache.cache_dir().glob("*.json")
    assert json.loads(entry.read_text())["head_precision"] == "bfloat16"
    second, _ = load(pair_on_disk)
    assert len(timings) == 2 and second.calibration_s == 0.0
    assert second.engine.drafter.dtype == torch.bfloat16


def test_the_rounds_thread_count_is_timed_once_and_kept_with_the_costs(
    pair_on_disk, monkeypatch
) -> None:
    timed = []

    def fake_choice(runner, drafter):
        timed.append(torch.get_num_threads())
        return RoundThreads(plain=3, drafted=1)

    monkeypatch.setattr(loading, "fastest_round_threads", fake_choice)
    first, _ = load(pair_on_disk)
    assert timed and first.engine.round_threads == first.round_threads == RoundThreads(3, 1)
    (entry,) = calibration_cache.cache_dir().glob("*.json")
    assert json.loads(entry.read_text())["round_threads"] == {"plain": 3, "drafted": 1}
    second, _ = load(pair_on_disk)
    assert len(timed) == 1 and second.calibration_s == 0.0
    assert second.engine.round_threads == RoundThreads(3, 1)


def test_an_asked_thread_count_is_used_untimed_and_cached_apart(pair_on_disk, monkeypatch) -> None:
    monkeypatch.setattr(loading, "fastest_round_threads", lambda *_: pytest.fail("timed"))
    config = LoadConfig(
        target=str(pair_on_disk / "target"),
        head=str(pair_on_disk / "head"),
        dtype="float32",
        round_threads=1,
    )
    pair = drain(load_steps(prepare(config, config.target, config.head)))
    assert pair.engine.round_threads == RoundThreads(1, 1) and pair.calibration_s > 0
    (entry,) = calibration_cache.cache_dir().glob("*.json")
    data = json.loads(entry.read_text())
    assert data["key"]["round_threads"] == 1
    assert data["round_threads"] == {"plain": 1, "drafted": 1}


def test_a_negative_thread_count_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="round threads"):
        LoadConfig(target="t", round_threads=-1)


def test_an_entry_is_kept_whole_or_not_at_all(tmp_path, caplog) -> None:
    """cache_home.keep, which every cache here writes through: a write that fails half way
    leaves the old entry as it was, and a path it cannot create is logged, not raised."""
    path = tmp_path / "entries" / "one.json"
    keep(path, lambda partial: partial.write_text("old"), "an entry")
    assert path.read_text() == "old"

    def fails_half_way(partial) -> None:
        partial.write_text("half")
        raise OSError("disk full")

    keep(path, fails_half_way, "an entry")
    assert path.read_text() == "old" and "disk full" in caplog.text
    assert sorted(p.name for p in path.parent.iterdir()) == ["one.json"]  # no partial left
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    keep(blocker / "under" / "entry.json", lambda partial: partial.write_text("x"), "another")
    assert "could not keep another" in caplog.text
