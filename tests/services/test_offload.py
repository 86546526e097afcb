"""Targets whose weights accelerate offloads to CPU or disk (weights on ``meta``, loaded at each
call): the head is placed where the target's lm_head runs, never left on ``meta``, and EAGLE
output stays equal to plain greedy decoding (issue 14.8)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from backend.engine.target import TargetRunner
from backend.errors import ConfigError
from backend.services.loading import bind_head, warmup
from tests.engine.helpers import run
from tests.factories import tiny_head, tiny_target

PROMPT = [3, 17, 42, 9, 100, 7]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("offload") / "target"
    tiny_target("llama", num_layers=8).save_pretrained(folder)
    return folder


def offloaded(saved: Path, how: str, tmp_path: Path):
    if how == "cpu_offload":  # accelerate's own API: every weight on meta, run on the CPU
        from accelerate import cpu_offload

        model = AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32)
        return cpu_offload(model, execution_device=torch.device("cpu")).eval()
    device_map = {
        "model.embed_tokens": "disk",
        "model.rotary_emb": "cpu",
        "model.norm": "cpu",
        "lm_head": "disk",
    }
    device_map.update({f"model.layers.{i}": "cpu" if i < 4 else "disk" for i in range(8)})
    return AutoModelForCausalLM.from_pretrained(
        saved, dtype=torch.float32, device_map=device_map, offload_folder=str(tmp_path / "disk")
    ).eval()


@pytest.mark.parametrize("how", ["cpu_offload", "disk_and_cpu"])
@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
def test_head_is_placed_beside_an_offloaded_target(saved, tmp_path, how, kind) -> None:
    reference = AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32).eval()
    model = offloaded(saved, how, tmp_path)
    assert model.get_output_embeddings().weight.device.type == "meta"  # the scenario
    head, drafter = bind_head(model, tiny_head(kind, reference), torch.float32)
    assert {p.device.type for p in head.parameters()} == {"cpu"}
    assert head.rotary.inv_freq.device.type == "cpu"
    runner = TargetRunner(model, drafter.feature_indices)
    assert runner.device.type == "cpu"
    warmup(runner, drafter)
    eagle, _ = run(runner, drafter, PROMPT, mode="eagle", max_new_tokens=12)
    plain = TargetRunner(reference)
    vanilla, _ = run(plain, None, PROMPT, mode="vanilla", max_new_tokens=12)
    assert eagle.token_ids == vanilla.token_ids


def test_head_is_refused_when_the_lm_head_has_nowhere_to_run(saved) -> None:
    model = AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32).eval()
    model.lm_head.to("meta")  # offloaded by hand, without a dispatch hook
    with pytest.raises(ConfigError, match="cannot be placed") as caught:
        bind_head(model, tiny_head("eagle3", model), torch.float32)
    assert "device_map" in caught.value.hint
