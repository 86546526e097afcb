"""The bundled catalog's content, and strict validation of catalog entries."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from backend.errors import ConfigError
from backend.services.catalog import REPO_ROOT, PairSpec, find_pair, load_catalog

# Every head the EAGLE authors released, with its target.
RELEASED = {
    "yuhuili/EAGLE-Vicuna-7B-v1.3": ("lmsys/vicuna-7b-v1.3", "eagle1"),
    "yuhuili/EAGLE-Vicuna-13B-v1.3": ("lmsys/vicuna-13b-v1.3", "eagle1"),
    "yuhuili/EAGLE-Vicuna-33B-v1.3": ("lmsys/vicuna-33b-v1.3", "eagle1"),
    "yuhuili/EAGLE-llama2-chat-7B": ("meta-llama/Llama-2-7b-chat-hf", "eagle1"),
    "yuhuili/EAGLE-llama2-chat-13B": ("meta-llama/Llama-2-13b-chat-hf", "eagle1"),
    "yuhuili/EAGLE-llama2-chat-70B": ("meta-llama/Llama-2-70b-chat-hf", "eagle1"),
    "yuhuili/EAGLE-mixtral-instruct-8x7B": ("mistralai/Mixtral-8x7B-Instruct-v0.1", "eagle1"),
    "yuhuili/EAGLE-LLaMA3-Instruct-8B": ("meta-llama/Meta-Llama-3-8B-Instruct", "eagle1"),
    "yuhuili/EAGLE-LLaMA3-Instruct-70B": ("meta-llama/Meta-Llama-3-70B-Instruct", "eagle1"),
    "yuhuili/EAGLE-LLaMA3.1-Instruct-8B": ("meta-llama/Llama-3.1-8B-Instruct", "eagle1"),
    "yuhuili/EAGLE-Qwen2-7B-Instruct": ("Qwen/Qwen2-7B-Instruct", "eagle1"),
    "yuhuili/EAGLE-Qwen2-72B-Instruct": ("Qwen/Qwen2-72B-Instruct", "eagle1"),
    "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B": ("meta-llama/Llama-3.1-8B-Instruct", "eagle3"),
    "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B": ("meta-llama/Llama-3.3-70B-Instruct", "eagle3"),
    "yuhuili/EAGLE3-Vicuna1.3-13B": ("lmsys/vicuna-13b-v1.3", "eagle3"),
    "yuhuili/EAGLE3-DeepSeek-R1-Distill-LLaMA-8B": (
        "deepseek-ai/DeepSeek-R1-Distill-Llama-8B",
        "eagle3",
    ),
    "AngelSlim/Qwen3-1.7B_eagle3": ("Qwen/Qwen3-1.7B", "eagle3"),
    "AngelSlim/Qwen3-4B_eagle3": ("Qwen/Qwen3-4B", "eagle3"),
    "AngelSlim/Qwen3-8B_eagle3": ("Qwen/Qwen3-8B", "eagle3"),
    "AngelSlim/Qwen3-14B_eagle3": ("Qwen/Qwen3-14B", "eagle3"),
    "AngelSlim/Qwen3-32B_eagle3": ("Qwen/Qwen3-32B", "eagle3"),
    "Tengyunw/qwen3_8b_eagle3": ("Qwen/Qwen3-8B", "eagle3"),
}


def _entry(**overrides: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": "tiny",
        "target": "org/target",
        "head": "org/head",
        "head_kind": "eagle3",
        "target_gb": 1.0,
        "head_gb": 0.1,
        "gated": False,
        "tree": {"total_tokens": 12, "depth": 5, "top_k": 4},
    }
    entry.update(overrides)
    return entry


def _write(tmp_path: Path, *entries: dict[str, Any]) -> Path:
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps({"pairs": list(entries)}))
    return path


def test_bundled_catalog_has_every_released_head() -> None:
    pairs = {pair.head: pair for pair in load_catalog() if not pair.offline}
    assert set(pairs) == set(RELEASED)
    for head, (target, kind) in RELEASED.items():
        pair = pairs[head]
        assert (pair.target, pair.head_kind) == (target, kind), head
        assert pair.gated == target.startswith(("meta-llama/", "google/", "mistralai/")), head
        depth = 8 if kind == "eagle3" else 6
        assert (pair.tree.total_tokens, pair.tree.depth, pair.tree.top_k) == (60, depth, 10)
        assert pair.target_gb > pair.head_gb > 0 and pair.dtype != "auto" and pair.note


def test_demo_pair_is_offline_with_paths_under_the_repo_root() -> None:
    demo = find_pair("demo")
    assert demo.offline and demo.head_kind == "eagle3" and demo.dtype == "float32"
    assert demo.target == str(REPO_ROOT / "assets" / "demo" / "target")
    assert demo.head == str(REPO_ROOT / "assets" / "demo" / "head-eagle3")
    assert (demo.tree.total_tokens, demo.tree.depth, demo.tree.top_k) == (12, 5, 4)


def test_names_are_unique_and_findable() -> None:
    pairs = load_catalog()
    assert len({pair.name for pair in pairs}) == len(pairs)
    pair = find_pair("llama3.1-8b-eagle3")
    assert isinstance(pair, PairSpec) and pair.head == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    assert pair.total_gb == pytest.approx(pair.target_gb + pair.head_gb)


def test_unknown_pair_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as info:
        find_pair("gpt-5-eagle")
    assert "gpt-5-eagle" in info.value.message and "llama3.1-8b-eagle3" in info.value.hint


def test_offline_entry_resolves_relative_paths_against_the_repo_root(tmp_path: Path) -> None:
    path = _write(tmp_path, _entry(target="assets/x", head="/abs/head", offline=True))
    (pair,) = load_catalog(path)
    assert pair.target == str(REPO_ROOT / "assets" / "x") and pair.head == "/abs/head"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"head_knid": "eagle3"}, "unknown keys ['head_knid']"),
        ({"head_kind": "medusa"}, "head_kind must be one of"),
        ({"tree": {"total_tokens": 1, "depth": 5, "top_k": 4}}, "total_tokens must be >= 2"),
        ({"tree": {"total_tokens": 12, "depth": 5}}, "tree must have exactly"),
        ({"tree": {"total_tokens": 12.5, "depth": 5, "top_k": 4}}, "must be integers"),
        ({"target": "assets/demo/target"}, "is not a Hub repo id"),
        ({"gated": "yes"}, "gated has the wrong type"),
        ({"target_gb": True}, "target_gb has the wrong type"),
        ({"head_gb": -1}, "non-negative"),
        ({"dtype": "int4"}, "dtype must be one of"),
    ],
)
def test_invalid_entries_are_config_errors_naming_the_entry(
    tmp_path: Path, overrides: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_catalog(_write(tmp_path, _entry(**overrides)))
    assert expected in info.value.message
    assert "'tiny'" in info.value.message


def test_missing_keys_duplicates_and_bad_json_are_config_errors(tmp_path: Path) -> None:
    entry = _entry()
    del entry["head"]
    with pytest.raises(ConfigError, match="missing keys \\['head'\\]"):
        load_catalog(_write(tmp_path, entry))
    with pytest.raises(ConfigError, match="duplicate pair names"):
        load_catalog(_write(tmp_path, _entry(), _entry()))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_catalog(broken)
    with pytest.raises(ConfigError, match="catalog not found"):
        load_catalog(tmp_path / "absent.json")
