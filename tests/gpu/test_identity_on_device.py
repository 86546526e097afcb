"""fp32 greedy identity on the device: EAGLE == vanilla == transformers' ``generate`` for random
Llama and Qwen3 targets (also with context drafts merged into the tree), Mistral and Gemma 3
targets past their sliding window, and the bundled demo pair, with both head kinds. The checks
are the CPU tests' own, run where the tensors are."""

from __future__ import annotations

import pytest

from backend.config import LoadConfig
from backend.services.loading import load_pair
from tests.engine.test_loop_identity import assert_identity, assert_merged_identity, hf_greedy
from tests.engine.test_sliding_window import assert_identity_past_the_window, sliding_target
from tests.factories import tiny_target
from tests.gpu.device import DEVICE, HEAD_KINDS, ON_DEVICE, placed
from tests.test_demo_pair import DEMO, PROMPTS, chat_ids, summary

pytestmark = ON_DEVICE


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("kind", HEAD_KINDS)
def test_random_targets(arch: str, kind: str) -> None:
    target, head = placed(
        tiny_target(arch, num_layers=8), kind, draft_vocab_size=100 if kind == "eagle3" else None
    )
    assert target.device == DEVICE
    assert_identity(target, head, f"{arch}/{kind} on {DEVICE}")


@pytest.mark.parametrize("kind", ["eagle3", "no head"])
def test_context_drafts_merged_into_the_tree(kind: str) -> None:
    target = tiny_target("llama", num_layers=8).to(DEVICE)
    head = None
    if kind != "no head":
        target, head = placed(target, kind, draft_vocab_size=100)
    assert_merged_identity(target, head, f"llama/{kind} on {DEVICE}")


@pytest.mark.parametrize("name", ["mistral", "gemma3"])
@pytest.mark.parametrize("kind", HEAD_KINDS)
def test_sliding_window_targets_past_the_window(name: str, kind: str) -> None:
    model, window = sliding_target(name)
    model, head = placed(model, kind, draft_vocab_size=100 if kind == "eagle3" else None)
    assert_identity_past_the_window(model, head, window, f"{name}/{kind} on {DEVICE}")


@pytest.mark.parametrize("head", ["head-eagle1", "head-eagle3"])
def test_demo_pair(head: str) -> None:
    pair = load_pair(
        LoadConfig(target=str(DEMO / "target"), head=str(DEMO / head), dtype="float32")
    )
    assert pair.info.device == str(DEVICE) and pair.info.dtype == "float32"
    taus = []
    for prompt in PROMPTS:
        eagle = summary(pair, prompt, "eagle", stop_on_eos=False)
        vanilla = summary(pair, prompt, "vanilla", stop_on_eos=False)
        expected = hf_greedy(pair.model, chat_ids(pair, prompt), eagle.new_tokens)
        assert list(eagle.token_ids) == list(vanilla.token_ids) == expected, prompt
        taus.append(eagle.tau)
    assert sum(taus) / len(taus) > 1.5  # trained heads: the identity covers multi-token rounds
