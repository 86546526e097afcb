"""A bfloat16 head under a float32 target: still lossless, chosen only when it drafts faster,
and the choice kept with the tree costs so the next load makes the same one untimed."""

from __future__ import annotations

import pytest
import torch

from backend.config import TreeConfig
from backend.engine import head_precision
from backend.engine.drafter import EagleDrafter
from backend.engine.head_precision import choose_head_precision, lowered_copy, precision_name
from backend.services.calibration_cache import Calibration
from tests.engine.helpers import make_runner, run
from tests.factories import easy_llama_pair, tiny_head, tiny_target

PROMPT = [5, 17, 33, 2, 90, 41, 7, 7, 150]


@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
def test_a_bfloat16_head_under_a_float32_target_stays_lossless(kind: str) -> None:
    target = tiny_target("llama", num_layers=8)
    head = lowered_copy(tiny_head(kind, target, draft_vocab_size=100 if kind == "eagle3" else None))
    assert head.dtype_device()[0] == torch.bfloat16
    assert next(target.parameters()).dtype == torch.float32
    runner, drafter = make_runner(target, head)
    for tree in (TreeConfig(total_tokens=8, depth=4, top_k=2), TreeConfig(7, 6, 1)):
        vanilla, _ = run(runner, None, PROMPT, mode="vanilla", max_new_tokens=24, stop_on_eos=False)
        eagle, rounds = run(
            runner, drafter, PROMPT, max_new_tokens=24, tree=tree, stop_on_eos=False
        )
        assert eagle.token_ids == vanilla.token_ids
        assert all(r.tree_size > 1 for r in rounds[1:])  # it did draft


def test_a_bfloat16_head_keeps_drafting_what_the_float32_one_does() -> None:
    """On a head that knows its target, bfloat16 rounding changes how often drafts hold little."""
    target, head = easy_llama_pair()
    runner, drafter = make_runner(target, head)
    prompt = [5, 17, 33, 2, 9, 41]  # the pair's vocabulary is 64 tokens
    tree = TreeConfig(total_tokens=8, depth=4, top_k=2)  # a fixed tree: no tuner in between
    full, _ = run(runner, drafter, prompt, max_new_tokens=48, stop_on_eos=False, tree=tree)
    runner, lowered = make_runner(target, lowered_copy(head))
    low, _ = run(runner, lowered, prompt, max_new_tokens=48, stop_on_eos=False, tree=tree)
    assert low.token_ids == full.token_ids
    tau = [sum(s.acceptance_lengths) / s.rounds for s in (full, low)]
    assert tau[0] > 2.0 and tau[1] > 0.8 * tau[0]


@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
def test_a_bfloat16_head_attends_in_float32(kind: str) -> None:
    """Its KV cache and attention stay float32 (bfloat16 one-query attention slows with the
    context on CPUs); the rest of the head runs in bfloat16."""
    from transformers import DynamicCache

    target = tiny_target("llama")
    lowered = lowered_copy(tiny_head(kind, target))
    attentions = [m for m in lowered.modules() if hasattr(m, "attention_dtype")]
    assert attentions and all(m.attention_dtype == torch.float32 for m in attentions)
    assert lowered.dtype_device()[0] == torch.bfloat16
    cache = DynamicCache()
    features = torch.randn(1, 3, lowered.config.hidden_size, dtype=torch.bfloat16)
    with torch.inference_mode():
        hidden = lowered(features, torch.tensor([[1, 2, 3]]), torch.arange(3)[None], None, cache)
    assert hidden.dtype == torch.bfloat16 and torch.isfinite(hidden.float()).all()
    assert cache.layers[0].keys.dtype == torch.float32


def test_the_copy_shares_the_borrowed_target_modules_and_leaves_the_original() -> None:
    target = tiny_target("llama", num_layers=8)
    head = tiny_head("eagle1", target)
    lowered = lowered_copy(head)
    assert lowered.embedding is target.get_input_embeddings()
    assert lowered.borrowed_modules() == head.borrowed_modules()
    assert head.dtype_device()[0] == torch.float32
    assert next(target.parameters()).dtype == torch.float32
    assert precision_name(lowered, torch.float32) == "bfloat16"
    assert precision_name(head, torch.float32) == "target"


def choose(monkeypatch, known: str | None, lower_wins: bool | None):
    """choose_head_precision on a tiny pair, with the timing replaced (None: must not run)."""
    monkeypatch.setattr(head_precision, "can_lower", lambda head: True)

    def timed(drafter, prompt, features) -> float:
        assert lower_wins is not None, "timed although the choice was known"
        lowered = drafter.head.dtype_device()[0] == torch.bfloat16
        return 1.0 if lowered == lower_wins else 2.0

    monkeypatch.setattr(head_precision, "drafting_s", timed)
    target = tiny_target("llama", num_layers=8)
    head = tiny_head("eagle3", target)
    runner, drafter = make_runner(target, head)
    layers = target.config.num_hidden_layers
    return choose_head_precision(runner, head, drafter, known, lambda h: EagleDrafter(h, layers))


@pytest.mark.parametrize(
    ("known", "lower_wins", "expected"),
    [
        (None, True, torch.bfloat16),
        (None, False, torch.float32),
        ("bfloat16", None, torch.bfloat16),
        ("target", None, torch.float32),
    ],
)
def test_bfloat16_only_when_timed_faster_or_known(monkeypatch, known, lower_wins, expected) -> None:
    head, drafter = choose(monkeypatch, known, lower_wins)
    assert head.dtype_device()[0] == expected
    assert drafter.head is head and drafter.dtype == expected


def test_the_choice_is_kept_with_the_costs() -> None:
    from backend.engine.calibration import CostModel

    costs = CostModel(verify_s={1: 0.01, 2: 0.012}, draft_step_s=0.001)
    again = Calibration.from_json(Calibration(costs, {}, "bfloat16").to_json())
    assert again.head_precision == "bfloat16" and again.costs == costs
