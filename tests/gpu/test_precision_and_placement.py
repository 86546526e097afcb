"""bf16 on the device (a generation and the race verdict, through the Backend as the app calls
it) and a target partly offloaded by an accelerate ``device_map``, with the head placed beside
the lm_head and EAGLE output equal to plain decoding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from backend.api import Backend
from backend.config import LoadConfig
from backend.engine.target import TargetRunner
from backend.events import Finished, Loaded
from backend.services.loading import bind_head, warmup
from models.heads.base import execution_device
from tests.engine.helpers import run
from tests.factories import tiny_head
from tests.gpu.device import DEVICE, HEAD_KINDS, ON_DEVICE
from tests.services.conftest import SavedPairs, greedy
from tests.services.test_api import MESSAGES, assert_identical_race
from tests.services.test_offload import PROMPT

pytestmark = ON_DEVICE


def test_bf16_generation_and_race_verdict(saved_pairs: SavedPairs) -> None:
    """The easy pair's logits are far apart, so bf16 rounding cannot flip a greedy choice: the
    race must come out identical, and the verdict must say so."""
    backend = Backend()
    config = LoadConfig(str(saved_pairs.target), str(saved_pairs.head), dtype="bfloat16")
    events = list(backend.load(config))
    assert isinstance(events[-1], Loaded), events[-1]
    assert (events[-1].info.dtype, events[-1].info.device) == ("bfloat16", str(DEVICE))
    assert backend.pair is not None
    assert {p.dtype for p in backend.pair.model.parameters()} == {torch.bfloat16}

    reply = list(backend.stream(MESSAGES, greedy(24)))[-1]
    assert isinstance(reply, Finished), reply
    assert reply.summary.new_tokens == 24 and reply.summary.tau > 1.5
    assert_identical_race(backend)


def partly_offloaded_map(num_layers: int) -> dict[str, int | str]:
    """Embedding, norm, lm_head and the first half of the layers on the device; the second
    half offloaded (to CPU memory beside a GPU; to disk in the CPU rehearsal, where CPU memory
    is the device itself)."""
    main: int | str = DEVICE.index if DEVICE.type == "cuda" else "cpu"
    offload = "cpu" if DEVICE.type == "cuda" else "disk"
    device_map: dict[str, int | str] = {
        name: main for name in ("model.embed_tokens", "model.rotary_emb", "model.norm", "lm_head")
    }
    for index in range(num_layers):
        device_map[f"model.layers.{index}"] = main if index < num_layers // 2 else offload
    return device_map


@pytest.mark.parametrize("kind", HEAD_KINDS)
def test_device_map_with_half_the_layers_offloaded(saved: Path, tmp_path: Path, kind: str) -> None:
    reference = AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32).to(DEVICE).eval()
    num_layers = reference.config.num_hidden_layers
    model = AutoModelForCausalLM.from_pretrained(
        saved,
        dtype=torch.float32,
        device_map=partly_offloaded_map(num_layers),
        offload_folder=str(tmp_path / "offload"),
    ).eval()
    last = model.model.layers[-1]
    assert next(last.parameters()).device != DEVICE  # the scenario: weights kept elsewhere
    assert execution_device(last) == DEVICE  # ... and brought to the device for each call

    head, drafter = bind_head(model, tiny_head(kind, reference), torch.float32)
    assert {p.device for p in head.parameters()} == {DEVICE}
    runner = TargetRunner(model, drafter.feature_indices)
    assert runner.device == DEVICE
    warmup(runner, drafter)
    eagle, rounds = run(runner, drafter, PROMPT, mode="eagle", max_new_tokens=16)
    vanilla, _ = run(TargetRunner(reference), None, PROMPT, mode="vanilla", max_new_tokens=16)
    assert eagle.token_ids == vanilla.token_ids
    assert max(r.tree_size for r in rounds) > 1
