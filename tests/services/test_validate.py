"""Head-versus-target validation: one test per mismatch kind, each message naming both values,
and the check running on config.json before any target weight is read."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from transformers import BertConfig, T5Config

from backend.api import Backend
from backend.config import LoadConfig
from backend.errors import IncompatibleHeadError
from backend.events import LoadFailed
from backend.services.loading import prepare
from backend.services.validate import check_head_fits_target
from models.heads.config import HeadKind, head_config_for_target
from tests.factories import target_config
from tests.services.conftest import SavedPairs


def mismatch(head, target, **kwargs) -> str:
    with pytest.raises(IncompatibleHeadError) as info:
        check_head_fits_target(head, target, head_name="my-head", **kwargs)
    assert "my-head" in info.value.message
    assert info.value.hint
    return info.value.message


def test_a_fitting_head_passes() -> None:
    target = target_config("llama", vocab_size=300, num_layers=8)
    for kind in HeadKind:
        check_head_fits_target(
            head_config_for_target(target, kind), target, expected_kind=kind.value
        )


def test_hidden_size_mismatch_names_both_sizes() -> None:
    target = target_config("llama", vocab_size=300, num_layers=8)
    head = head_config_for_target(target_config("llama", vocab_size=300), HeadKind.EAGLE1)
    wide = dataclasses.replace(head, hidden_size=96, num_attention_heads=4, head_dim=24)
    assert "hidden size: head 96 vs target 64" in mismatch(wide, target)
    eagle3 = head_config_for_target(target, HeadKind.EAGLE3)
    eagle3.target_hidden_size = 128
    assert "target hidden size: head expects 128, target has 64" in mismatch(eagle3, target)


def test_vocabulary_mismatch_names_both_sizes() -> None:
    target = target_config("qwen3", vocab_size=300, num_layers=8)
    head = head_config_for_target(target_config("qwen3", vocab_size=1000), HeadKind.EAGLE1)
    assert "vocabulary size: head 1000 vs target 300" in mismatch(head, target)


def test_eagle3_layer_count_names_the_minimum_and_the_target() -> None:
    shallow = target_config("llama", vocab_size=300, num_layers=4)
    head = head_config_for_target(shallow, HeadKind.EAGLE3)
    assert "at least 7 layers, target has 4" in mismatch(head, shallow)
    check_head_fits_target(head_config_for_target(shallow, HeadKind.EAGLE1), shallow)  # EAGLE-1 ok


def test_head_kind_mismatch_names_expected_and_detected() -> None:
    target = target_config("llama", vocab_size=300, num_layers=8)
    head = head_config_for_target(target, HeadKind.EAGLE1)
    message = mismatch(head, target, expected_kind="eagle3")
    assert "head kind: expected eagle3, the checkpoint is eagle1" in message


@pytest.mark.parametrize(
    "config, name",
    [
        (
            BertConfig(vocab_size=300, hidden_size=64, architectures=["BertForMaskedLM"]),
            "BertForMaskedLM",
        ),
        (
            T5Config(vocab_size=300, d_model=64, architectures=["T5ForConditionalGeneration"]),
            "T5ForConditionalGeneration",
        ),
    ],
)
def test_architecture_mismatch_names_head_kind_and_target_architecture(config, name) -> None:
    head = head_config_for_target(target_config("llama", vocab_size=300), HeadKind.EAGLE1)
    message = mismatch(head, config)
    assert (
        f"architecture: a eagle1 head drafts for a decoder-only *ForCausalLM target, target is {name}"
        in message
    )


def test_every_problem_is_listed_at_once() -> None:
    target = target_config("llama", vocab_size=300, num_layers=4)
    head = head_config_for_target(target_config("llama", vocab_size=1000), HeadKind.EAGLE3)
    message = mismatch(head, target, expected_kind="eagle1")
    for part in ("head kind", "vocabulary size: head 1000 vs target 300", "target has 4"):
        assert part in message


def test_mismatch_is_found_from_config_json_alone(saved_pairs: SavedPairs, tmp_path: Path) -> None:
    """A target folder with no weights at all: the check must fail before weights are needed."""
    shutil.copy(saved_pairs.target / "config.json", tmp_path / "config.json")
    config = LoadConfig(target=str(tmp_path), head=str(saved_pairs.foreign_head))
    with pytest.raises(IncompatibleHeadError, match="vocabulary size: head 1000 vs target 300"):
        prepare(config, str(tmp_path), str(saved_pairs.foreign_head))


def test_catalog_head_kind_is_cross_checked_on_load(
    saved_pairs: SavedPairs, tmp_path: Path
) -> None:
    """The catalog says eagle3, the checkpoint is EAGLE-1: the load fails, naming both."""
    entry = {
        "name": "mislabelled",
        "target": str(saved_pairs.target),
        "head": str(saved_pairs.head),
        "head_kind": "eagle3",
        "target_gb": 0.001,
        "head_gb": 0.001,
        "gated": False,
        "tree": {"total_tokens": 8, "depth": 4, "top_k": 2},
        "offline": True,
    }
    catalog = tmp_path / "catalog.json"
    catalog.write_text(json.dumps({"version": 1, "pairs": [entry]}))
    backend = Backend(catalog_path=catalog)
    events = list(backend.load(LoadConfig(str(saved_pairs.target), str(saved_pairs.head))))
    assert isinstance(events[-1], LoadFailed)
    assert events[-1].code == "incompatible_head"
    assert "expected eagle3, the checkpoint is eagle1" in events[-1].message
    assert backend.status().loaded is None
