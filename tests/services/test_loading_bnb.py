"""bitsandbytes 4-bit (nf4) and 8-bit targets on CPU: they load through ``LoadConfig``, the head
stays unquantized, and EAGLE decoding equals vanilla decoding of the same quantized target."""

from __future__ import annotations

import logging

import pytest
import torch

from backend.api import Backend
from backend.config import LoadConfig
from backend.events import Finished, Loaded, Progress
from tests.services.conftest import SavedPairs, greedy

MESSAGES = [{"role": "user", "content": "hello world"}]


def run(backend: Backend, mode: str):
    events = list(backend.stream(MESSAGES, greedy(24, mode)))
    assert isinstance(events[-1], Finished), events[-1]
    return events[-1].summary


@pytest.mark.parametrize(
    "quantization, layer_class", [("4bit", "Linear4bit"), ("8bit", "Linear8bitLt")]
)
def test_quantized_target_eagle_equals_vanilla(
    saved_pairs: SavedPairs, quantization: str, layer_class: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = LoadConfig(str(saved_pairs.target), str(saved_pairs.head), quantization=quantization)
    assert_quantized_eagle_equals_vanilla(config, layer_class, caplog)


def assert_quantized_eagle_equals_vanilla(
    config: LoadConfig, layer_class: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The easy pair loads quantized (decoder Linears of ``layer_class``, lm_head and head
    not), and greedy EAGLE equals vanilla decoding of the same quantized target, silently."""
    quantization = config.quantization
    backend = Backend()
    events = list(backend.load(config))
    assert isinstance(events[-1], Loaded), events[-1]
    stages = [e.stage for e in events if isinstance(e, Progress)]
    assert stages[0] == "resolve" and "quantize" in stages and stages[-1] == "warmup"
    assert events[-1].info.quantization == quantization

    pair = backend.pair
    assert pair is not None
    q_proj = pair.model.model.layers[0].self_attn.q_proj
    assert type(q_proj).__name__ == layer_class  # the decoder's Linear layers are quantized
    assert type(pair.model.lm_head) is torch.nn.Linear  # the lm_head the head borrows is not
    assert {p.dtype for p in pair.head.parameters()} == {torch.float32}  # head unquantized

    with caplog.at_level(logging.WARNING):
        eagle = run(backend, "eagle")
        vanilla = run(backend, "vanilla")
    assert eagle.token_ids == vanilla.token_ids
    assert eagle.text == vanilla.text
    assert eagle.new_tokens == 24
    assert eagle.tau > 1.5  # drafts were accepted: the identity covers multi-token rounds
    assert vanilla.tau == 1.0
    assert not [r for r in caplog.records if r.name.startswith("bitsandbytes")]


def test_quantization_lowers_the_memory_estimate(saved_pairs: SavedPairs) -> None:
    backend = Backend()
    sizes = {
        q: backend.plan(str(saved_pairs.target), str(saved_pairs.head), quantization=q).memory_bytes
        for q in ("none", "8bit", "4bit")
    }
    assert sizes["4bit"] < sizes["8bit"] < sizes["none"]
