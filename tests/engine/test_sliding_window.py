"""Exact hybrid attention: targets with sliding-window layers (all of them, or mixed with full
attention as in Gemma 2/3 and Qwen2 with ``use_sliding_window``) at contexts of 3x the window.

Each tree node's logits must equal a plain forward of the prefix plus that node's path (the
model's own masks, no cache), and greedy EAGLE must equal vanilla and transformers' generate.
Targets with recurrent state are refused from their config, before any weight is read.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3TextConfig,
    MistralConfig,
    Qwen2Config,
)

from backend.config import LoadConfig, TreeConfig
from backend.engine import kv
from backend.engine.attention_layout import AttentionLayout, UnsupportedTargetError
from backend.engine.tree import DraftTree
from backend.services.loading import prepare
from tests.engine.helpers import make_runner, path_tokens, run, run_arms
from tests.engine.test_loop_identity import MERGED_ARMS, hf_greedy
from tests.factories import tiny_head

_COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    tie_word_embeddings=False,
    num_hidden_layers=8,
)

# name -> (config, window); every hybrid config mixes full and sliding layers.
SLIDING_CONFIGS = {
    "gemma2": lambda: Gemma2Config(
        **_COMMON,
        head_dim=16,
        sliding_window=16,
        attn_logit_softcapping=None,
        final_logit_softcapping=None,
        query_pre_attn_scalar=16,
    ),
    "gemma3": lambda: Gemma3TextConfig(
        **_COMMON, head_dim=16, sliding_window=24, query_pre_attn_scalar=16
    ),
    "mistral": lambda: MistralConfig(**_COMMON, sliding_window=32),
    "qwen2": lambda: Qwen2Config(
        **_COMMON, use_sliding_window=True, sliding_window=64, max_window_layers=3
    ),
}


def sliding_target(name: str, seed: int = 0):
    torch.manual_seed(seed)
    config = SLIDING_CONFIGS[name]()
    config._attn_implementation = "eager" if name == "gemma2" else "sdpa"  # gemma2: eager only
    model = AutoModelForCausalLM.from_config(config).eval()
    return model, int(config.sliding_window)


def random_prompt(length: int, seed: int) -> list[int]:
    return torch.randint(1, 256, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("name", list(SLIDING_CONFIGS))
def test_layouts_are_read_from_the_config(name: str) -> None:
    model, window = sliding_target(name)
    layout = AttentionLayout.of(model.config, model)
    if name == "mistral":
        assert layout.windows == {"sliding_attention": window} and not layout.per_type_masks
    else:
        assert layout.windows == {"full_attention": None, "sliding_attention": window}
        assert layout.per_type_masks


@pytest.mark.parametrize("name", list(SLIDING_CONFIGS))
def test_every_tree_node_sees_what_sequential_decoding_sees(name: str) -> None:
    """Branching tree after a prefix of 3 windows: node logits == forward of prefix + path."""
    model, window = sliding_target(name)
    runner, _ = make_runner(model)
    prefix = random_prompt(3 * window, seed=1)
    cache = runner.new_cache()
    runner.prefill(torch.tensor(prefix[:-1]), cache, with_features=False)
    # root, two children, grandchildren under both, a depth-4 path: parents precede children
    parents = torch.tensor([-1, 0, 0, 1, 1, 2, 3, 6, 7])
    tokens = torch.tensor([prefix[-1], *random_prompt(8, seed=2)])
    tree = DraftTree.from_parents(tokens, parents)
    logits = runner.verify(tree, cache, with_features=False).logits
    assert kv.cache_length(cache) == len(prefix) - 1 + tree.size
    with torch.no_grad():
        for node in range(tree.size):
            path = path_tokens(tree, node)
            reference = model(torch.tensor([prefix[:-1] + path])).logits[0, -1]
            torch.testing.assert_close(logits[node], reference, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", list(SLIDING_CONFIGS))
@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
def test_greedy_eagle_equals_vanilla_and_generate_past_the_window(name: str, kind: str) -> None:
    model, window = sliding_target(name)
    head = tiny_head(kind, model, draft_vocab_size=100 if kind == "eagle3" else None)
    runner, drafter = make_runner(model, head)
    prompt = random_prompt(2 * window, seed=3)
    new_tokens = window + 8  # the context ends past 3 windows
    expected = hf_greedy(model, prompt, new_tokens)
    vanilla, _ = run(runner, drafter, prompt, mode="vanilla", max_new_tokens=new_tokens)
    assert list(vanilla.token_ids) == expected
    chain = TreeConfig(total_tokens=5, depth=4, top_k=1)  # the model's own masks
    for tree in (TreeConfig(total_tokens=12, depth=4, top_k=3), TreeConfig(shape="static"), chain):
        eagle, rounds = run(
            runner, drafter, prompt, mode="eagle", max_new_tokens=new_tokens, tree=tree
        )
        assert list(eagle.token_ids) == expected, f"{name}/{kind}/{tree}"
        assert max(r.tree_size for r in rounds) > 1


@pytest.mark.parametrize("name", list(SLIDING_CONFIGS))
@pytest.mark.parametrize("kind", ["eagle3", "no head"])
def test_merged_trees_equal_generate_past_the_window(name: str, kind: str) -> None:
    """Context chains merged into the head's tree (or alone) past 3 windows: still exact."""
    model, window = sliding_target(name)
    head = tiny_head("eagle3", model, draft_vocab_size=100) if kind == "eagle3" else None
    runner, drafter = make_runner(model, head)
    prompt = random_prompt(2 * window, seed=3)
    new_tokens = window + 24
    arms = MERGED_ARMS if head is not None else [a for a in MERGED_ARMS if a.head is None]
    eagle, rounds = run_arms(runner, drafter, prompt, arms, mode="eagle", max_new_tokens=new_tokens)
    assert list(eagle.token_ids) == hf_greedy(model, prompt, new_tokens), f"{name}/{kind}"
    assert max(r.tree_size for r in rounds) > 1


@pytest.mark.parametrize("name", list(SLIDING_CONFIGS))
def test_windowed_layers_show_attention_only_their_window(name: str) -> None:
    """Past the window, a sliding layer attends over window - 1 cached keys plus the new ones
    (a round costs the same at any context length) while it keeps every entry for rollback."""
    model, window = sliding_target(name)
    runner, _ = make_runner(model)
    cache = runner.new_cache()
    prefix = random_prompt(3 * window, seed=4)
    runner.prefill(torch.tensor(prefix), cache, with_features=False)
    windows = runner.layout.layer_windows
    assert len(windows) == len(cache.layers) == model.config.num_hidden_layers
    for layer, layer_window in zip(cache.layers, windows, strict=True):
        new = torch.zeros_like(layer.keys[..., :5, :])
        keys, _ = layer.update(new, new)
        past = len(prefix) + 5
        assert layer.get_seq_length() == past  # every entry kept
        if layer_window:
            assert keys.shape[-2] == layer_window - 1 + 5
            assert layer.get_mask_sizes(1) == (layer_window, past - (layer_window - 1))
        else:
            assert keys.shape[-2] == past and layer.get_mask_sizes(1) == (past + 1, 0)
    assert any(windows), "every config here has sliding layers"


def test_a_window_blind_mask_is_caught(monkeypatch) -> None:
    """Negative control: the full-attention mask on sliding layers (the old behaviour) must fail
    the node-by-node check, so the check can see a missing window."""
    model, window = sliding_target("gemma3")
    runner, _ = make_runner(model)
    monkeypatch.setattr(runner, "layout", AttentionLayout({"full_attention": None}, False))
    prefix = random_prompt(3 * window, seed=1)
    cache = runner.new_cache()
    runner.prefill(torch.tensor(prefix[:-1]), cache, with_features=False)
    tree = DraftTree.from_parents(torch.tensor([prefix[-1], 5, 6]), torch.tensor([-1, 0, 0]))
    logits = runner.verify(tree, cache, with_features=False).logits
    with torch.no_grad():
        reference = model(torch.tensor([prefix])).logits[0, -1]
    assert not torch.allclose(logits[0], reference, atol=1e-4, rtol=1e-4)


# ---- targets that cannot be rolled back ---------------------------------------------------------

RECURRENT_CONFIGS = {
    "mamba": {"model_type": "mamba", "architectures": ["MambaForCausalLM"]},
    "jamba": {"model_type": "jamba", "architectures": ["JambaForCausalLM"]},
    "qwen3_next": {"model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"]},
    "lfm2": {"model_type": "lfm2", "architectures": ["Lfm2ForCausalLM"]},
}


@pytest.mark.parametrize("name", list(RECURRENT_CONFIGS))
def test_recurrent_targets_are_refused_before_any_weight(name: str, tmp_path: Path) -> None:
    """A folder with only config.json: the refusal must come from the config alone."""
    (tmp_path / "config.json").write_text(json.dumps(RECURRENT_CONFIGS[name]))
    with pytest.raises(UnsupportedTargetError, match="cannot be rolled back"):
        prepare(LoadConfig(target=str(tmp_path)), str(tmp_path), None)


def test_linear_attention_layer_types_are_refused() -> None:
    config = Gemma3TextConfig(**_COMMON, head_dim=16, sliding_window=24)
    config.layer_types = ["linear_attention", "full_attention"] * 4
    with pytest.raises(UnsupportedTargetError, match="linear_attention"):
        AttentionLayout.of(config)


@pytest.mark.parametrize("name", ["Cohere2Config", "GptOssConfig"])
def test_other_hybrid_configs_get_one_mask_per_layer_type(name: str) -> None:
    import transformers

    config = getattr(transformers, name)(num_hidden_layers=8, sliding_window=32)
    layout = AttentionLayout.of(config)
    assert layout.windows == {"full_attention": None, "sliding_attention": 32}
    assert layout.per_type_masks
