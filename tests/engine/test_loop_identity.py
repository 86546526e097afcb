"""Greedy identity (fp32): EAGLE output == vanilla output == transformers' own greedy generate,
across architectures, head kinds, tree shapes and stop conditions."""

from __future__ import annotations

import pytest
import torch

from backend.config import TreeConfig
from backend.engine.autotune import Arm
from tests.engine.helpers import make_runner, run, run_arms
from tests.factories import ARCHITECTURES, tiny_head, tiny_target

TREES = {
    "default": TreeConfig(),
    "chain": TreeConfig(total_tokens=6, depth=5, top_k=1),
    "wide": TreeConfig(total_tokens=25, depth=2, top_k=8),
    "depth1": TreeConfig(total_tokens=5, depth=1, top_k=4),
    "static": TreeConfig(shape="static"),
}
PROMPTS = ([5, 17, 33, 2, 90, 41], [200, 3, 3, 3, 7, 7, 150, 64, 12, 9, 1, 250])


def hf_greedy(target, prompt: list[int], max_new_tokens: int) -> list[int]:
    out = target.generate(
        torch.tensor([prompt]),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
def test_eagle_equals_vanilla_equals_transformers(arch: str, kind: str) -> None:
    target = tiny_target(arch, num_layers=8)
    head = tiny_head(kind, target, draft_vocab_size=100 if kind == "eagle3" else None)
    runner, drafter = make_runner(target, head)
    for prompt in PROMPTS:
        expected = hf_greedy(target, prompt, 40)
        vanilla, _ = run(runner, drafter, prompt, mode="vanilla", max_new_tokens=40)
        assert list(vanilla.token_ids) == expected
        for name, tree in TREES.items():
            eagle, rounds = run(runner, drafter, prompt, mode="eagle", max_new_tokens=40, tree=tree)
            assert list(eagle.token_ids) == expected, f"{arch}/{kind}/{name}"
            assert eagle.stop_reason == "max_new_tokens"
            assert max(r.tree_size for r in rounds) == (
                26 if name == "static" else tree.total_tokens
            )


# Rounds that merge context chains into the head's tree (a chain, a branching tree, two
# chains), context chains alone, and plain steps between them; the head catches up after those.
MERGED_ARMS = (
    Arm(TreeConfig(total_tokens=8, depth=4, top_k=2), context=6, chains=2),
    Arm(None, context=8, chains=1),
    Arm(TreeConfig(total_tokens=5, depth=4, top_k=1), context=4, chains=2),
    Arm(),
    Arm(TreeConfig(total_tokens=6, depth=5, top_k=1), context=12, chains=1),
)


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("kind", ["eagle1", "eagle3", "no head"])
def test_merged_trees_equal_vanilla(arch: str, kind: str) -> None:
    """Head and context drafts in one verified tree (or context drafts alone, with no head):
    greedy output equals transformers' greedy generate. Tiny random models fall into loops,
    so context drafts are accepted, which the test requires."""
    target = tiny_target(arch, num_layers=8)
    head = None
    if kind != "no head":
        head = tiny_head(kind, target, draft_vocab_size=100 if kind == "eagle3" else None)
    runner, drafter = make_runner(target, head)
    arms = MERGED_ARMS if head is not None else [a for a in MERGED_ARMS if a.head is None]
    for prompt in PROMPTS:
        expected = hf_greedy(target, prompt, 60)
        eagle, rounds = run_arms(runner, drafter, prompt, arms, mode="eagle", max_new_tokens=60)
        assert list(eagle.token_ids) == expected, f"{arch}/{kind}"
        assert eagle.accepted_context > 0
        assert len(eagle.token_sources) == eagle.new_tokens
        assert eagle.token_sources.count("context") == eagle.accepted_context
        assert sum(r.num_accepted_context for r in rounds) == eagle.accepted_context


@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
def test_eagle3_equal_vocab_and_stop_on_eos(kind: str) -> None:
    target = tiny_target("qwen3", num_layers=8)
    head = tiny_head(kind, target)  # draft vocab == target vocab
    runner, drafter = make_runner(target, head)
    prompt = PROMPTS[1]
    free_run = hf_greedy(target, prompt, 30)
    eos = free_run[12]  # a token the model is known to produce: make it the EOS
    first = free_run.index(eos)
    for mode in ("vanilla", "eagle"):
        summary, rounds = run(runner, drafter, prompt, mode=mode, max_new_tokens=30, eos_ids=[eos])
        assert summary.stop_reason == "eos"
        assert list(summary.token_ids) == free_run[: first + 1]
        assert sum(len(r.token_ids) for r in rounds) == summary.new_tokens


@pytest.mark.parametrize("max_new_tokens", [1, 2, 7])
def test_max_new_tokens_is_exact(max_new_tokens: int) -> None:
    target = tiny_target("llama", num_layers=8)
    runner, drafter = make_runner(target, tiny_head("eagle1", target))
    summary, _ = run(runner, drafter, PROMPTS[0], mode="eagle", max_new_tokens=max_new_tokens)
    assert summary.new_tokens == max_new_tokens
    assert list(summary.token_ids) == hf_greedy(target, PROMPTS[0], max_new_tokens)


def test_long_generation_grows_the_cache() -> None:
    """Prompt + generation far beyond any first-call size: the cache grows, output still exact."""
    target = tiny_target("llama", num_layers=8)
    runner, drafter = make_runner(target, tiny_head("eagle3", target))
    prompt = list(range(1, 200))
    eagle, _ = run(runner, drafter, prompt, mode="eagle", max_new_tokens=280)
    assert eagle.new_tokens == 280
    assert list(eagle.token_ids) == hf_greedy(target, prompt, 280)


def test_generation_stops_at_the_context_limit() -> None:
    target = tiny_target("llama", num_layers=8)  # max_position_embeddings = 512
    runner, drafter = make_runner(target, tiny_head("eagle1", target))
    prompt = list(range(1, 250)) * 2  # 498 tokens
    summary, _ = run(runner, drafter, prompt, mode="eagle", max_new_tokens=100)
    assert summary.stop_reason == "context_length"
    assert len(prompt) + summary.new_tokens == 512


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral", "gemma"])
def test_eagle3_with_full_draft_vocab(arch: str) -> None:
    """Draft vocab == target vocab (no d2t), and feature capture on more architectures."""
    target = tiny_target(arch, num_layers=10)
    runner, drafter = make_runner(target, tiny_head("eagle3", target))
    assert drafter.feature_indices == (2, 5, 7)
    for prompt in PROMPTS:
        eagle, _ = run(runner, drafter, prompt, mode="eagle", max_new_tokens=30)
        assert list(eagle.token_ids) == hf_greedy(target, prompt, 30)
