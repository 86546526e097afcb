"""Targets without a chat template get the conversation format their head was trained with, named
by the catalog (issue 14.4): Vicuna v1.1 for Vicuna v1.3 targets, plain completion for base
models; the loaded pair says which format it uses."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from app.render import pair_info_markdown
from backend.api import Backend
from backend.config import LoadConfig
from backend.errors import ConfigError
from backend.events import Loaded, Started
from backend.services.catalog import load_catalog
from backend.services.prompting import VICUNA_SYSTEM, prompt_ids, vicuna_prompt
from tests.services.conftest import greedy


def test_vicuna_v11_conversation_text() -> None:
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Add 2 and 3."},
    ]
    assert vicuna_prompt(messages) == (
        f"{VICUNA_SYSTEM} USER: Hi ASSISTANT: Hello!</s>USER: Add 2 and 3. ASSISTANT:"
    )
    system = [{"role": "system", "content": "Be brief."}, *messages[:1]]
    assert vicuna_prompt(system) == "Be brief. USER: Hi ASSISTANT:"


def test_catalog_names_the_format_of_template_less_targets() -> None:
    pairs = load_catalog()
    vicuna = [p for p in pairs if p.target.startswith("lmsys/vicuna")]
    assert vicuna and all(p.prompt_format == "vicuna_v1.1" for p in vicuna)
    assert next(p for p in pairs if p.name == "gemma3-270m").prompt_format == "plain"


def test_catalog_rejects_an_unknown_format(tmp_path: Path) -> None:
    entry = {
        "name": "x",
        "target": "a/b",
        "head": "c/d",
        "head_kind": "eagle1",
        "target_gb": 1,
        "head_gb": 1,
        "gated": False,
        "prompt_format": "alpaca",
        "tree": {"total_tokens": 8, "depth": 3, "top_k": 2},
    }
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps({"pairs": [entry]}))
    with pytest.raises(ConfigError, match="prompt_format"):
        load_catalog(path)


@pytest.fixture(scope="module")
def vicuna_like(saved_pairs, tmp_path_factory) -> tuple[Path, Path]:
    """The tiny target without its chat template, listed in a catalog as a Vicuna pair."""
    base = tmp_path_factory.mktemp("vicuna")
    target = base / "target"
    shutil.copytree(saved_pairs.target, target)
    (target / "chat_template.jinja").unlink()
    entry = {
        "name": "tiny-vicuna",
        "target": str(target),
        "head": str(saved_pairs.head),
        "head_kind": "eagle1",
        "target_gb": 0,
        "head_gb": 0,
        "gated": False,
        "offline": True,
        "prompt_format": "vicuna_v1.1",
        "tree": {"total_tokens": 8, "depth": 4, "top_k": 2},
    }
    (base / "catalog.json").write_text(json.dumps({"pairs": [entry]}))
    return target, base / "catalog.json"


def test_template_less_target_uses_the_catalog_format(saved_pairs, vicuna_like) -> None:
    target, catalog = vicuna_like
    tokenizer = AutoTokenizer.from_pretrained(target)
    assert not tokenizer.chat_template
    backend = Backend(catalog_path=catalog)
    events = list(backend.load(LoadConfig(target=str(target), head=str(saved_pairs.head))))
    assert isinstance(events[-1], Loaded), events[-1]
    info = events[-1].info
    assert info.prompt_format.startswith("Vicuna v1.1")
    assert "Vicuna v1.1" in pair_info_markdown(info)
    messages = [{"role": "user", "content": "hello world"}]
    started = next(e for e in backend.stream(messages, greedy(4)) if isinstance(e, Started))
    expected = tokenizer(vicuna_prompt(messages), add_special_tokens=True)["input_ids"]
    assert started.prompt_tokens == len(expected)
    assert started.prompt_tokens != len(prompt_ids(tokenizer, messages))  # not plain completion
