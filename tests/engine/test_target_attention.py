"""Grouped-query attention with a mask on a CPU target: keys and values go to SDPA as they are
(no copy per query head), with the same logits as the copies give."""

from __future__ import annotations

import torch

from backend.engine import kv
from backend.engine import target as target_module
from backend.engine.target import TargetRunner
from backend.engine.tree import DraftTree
from tests.factories import tiny_target


def test_a_cpu_target_asks_for_grouped_attention_with_masks(monkeypatch) -> None:
    monkeypatch.delenv("TRANSFORMERS_SDPA_FORCE_GQA", raising=False)
    TargetRunner(tiny_target("llama"))
    assert target_module.os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] == "1"


def test_an_explicit_setting_is_left_alone(monkeypatch) -> None:
    monkeypatch.setenv("TRANSFORMERS_SDPA_FORCE_GQA", "0")
    TargetRunner(tiny_target("llama"))
    assert target_module.os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] == "0"


def verified_logits(monkeypatch, force: str) -> list[torch.Tensor]:
    monkeypatch.setenv("TRANSFORMERS_SDPA_FORCE_GQA", force)
    model = tiny_target("qwen2")  # 4 query heads over 2 key/value heads
    runner = TargetRunner(model)
    cache = runner.new_cache()
    runner.prefill(torch.tensor([3, 1, 4, 1, 5, 9]), cache, with_features=False)
    chain = DraftTree.chain(torch.tensor([2, 6, 5, 3]))
    tree = DraftTree.from_parents(torch.tensor([2, 6, 7, 5, 8]), torch.tensor([-1, 0, 0, 1, 2]))
    out = []
    for drafted in (chain, tree):  # a causal mask with an offset, then a tree mask
        out.append(runner.verify(drafted, cache, with_features=False).logits)
        kv.truncate(cache, 6)
    return out


def test_grouped_attention_with_masks_gives_the_copies_logits(monkeypatch) -> None:
    copied = verified_logits(monkeypatch, "0")
    grouped = verified_logits(monkeypatch, "1")
    for ours, theirs in zip(grouped, copied):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
