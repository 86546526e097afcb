"""Tiny target/head pairs saved to disk once per session, for the services and API tests.

- ``easy``: a Llama target whose next token is mostly a fixed permutation of the current one,
  with an EAGLE-1 head that knows it, so drafts are often accepted (identity tests are
  meaningful, not 1-token rounds only);
- ``other``: a different (Qwen3) target with the same tokenizer, for switching models;
- ``foreign_head``: an EAGLE-1 head trained for a 1000-token vocabulary (fits nothing here).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from backend.config import GenerationConfig, TreeConfig
from models.checkpoints import save_head
from tests.factories import easy_llama_pair, tiny_head, tiny_target, tiny_tokenizer


@dataclass(frozen=True)
class SavedPairs:
    target: Path
    head: Path
    other_target: Path
    foreign_head: Path


@pytest.fixture(scope="session")
def saved_pairs(tmp_path_factory: pytest.TempPathFactory) -> SavedPairs:
    base = tmp_path_factory.mktemp("pairs")
    tokenizer = tiny_tokenizer(base / "target")
    target, head = easy_llama_pair(vocab_size=len(tokenizer), num_layers=8)
    target.generation_config.eos_token_id = tokenizer.eos_token_id
    target.save_pretrained(base / "target")
    save_head(head, base / "head")

    tiny_tokenizer(base / "other")
    other = tiny_target("qwen3", vocab_size=len(tokenizer), num_layers=4, seed=3)
    other.generation_config.eos_token_id = tokenizer.eos_token_id
    other.save_pretrained(base / "other")

    foreign = tiny_target("llama", vocab_size=1000, num_layers=2)
    save_head(tiny_head("eagle1", foreign), base / "foreign-head")
    return SavedPairs(base / "target", base / "head", base / "other", base / "foreign-head")


def greedy(max_new_tokens: int = 16, mode: str = "eagle") -> GenerationConfig:
    """Greedy, a fixed small tree, no EOS stop: exact token counts and comparable runs."""
    return GenerationConfig(
        mode=mode,  # type: ignore[arg-type]
        max_new_tokens=max_new_tokens,
        tree=TreeConfig(total_tokens=8, depth=4, top_k=2),
        stop_on_eos=False,
    )


@pytest.fixture
def pair_on_disk(tmp_path, monkeypatch) -> Path:
    """The easy pair saved under ``tmp_path`` (target/, head/), with a cache of its own there, for
    tests of what a load keeps on disk (calibration, tuner state)."""
    monkeypatch.setenv("EAGLECHAT_CACHE_DIR", str(tmp_path / "cache"))
    tokenizer = tiny_tokenizer(tmp_path / "target")
    target, head = easy_llama_pair(vocab_size=len(tokenizer))
    target.save_pretrained(tmp_path / "target")
    save_head(head, tmp_path / "head")
    return tmp_path
