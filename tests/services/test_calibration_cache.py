"""Calibration at load, kept on disk: the second load of the same pair reads it back, and any
change to what the costs depend on measures again."""

from __future__ import annotations

import json
import os

import pytest

from backend.config import LoadConfig
from backend.engine.progress import drain
from backend.engine.readout import form_of
from backend.services import calibration_cache
from backend.services.loading import load_steps, prepare
from models.checkpoints import save_head
from tests.factories import easy_llama_pair, tiny_tokenizer


@pytest.fixture
def pair_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLECHAT_CACHE_DIR", str(tmp_path / "cache"))
    tokenizer = tiny_tokenizer(tmp_path / "target")
    target, head = easy_llama_pair(vocab_size=len(tokenizer))
    target.save_pretrained(tmp_path / "target")
    save_head(head, tmp_path / "head")
    return tmp_path


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
