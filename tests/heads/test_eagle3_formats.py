"""EAGLE-3 checkpoints in the official layout and in SpecForge's (SGLang) layout.

SpecForge's ``LlamaForCausalLMEagle3`` (sgl-project/SpecForge, specforge/modeling/draft/
llama3_eagle.py) registers: ``embed_tokens.weight``, ``fc.weight`` (Linear(3 * target_hidden_size
-> hidden_size, bias=False)), ``midlayer.self_attn.{q,k,v,o}_proj.weight`` with q/k/v reading
2 * hidden_size, ``midlayer.mlp.{gate,up,down}_proj.weight``,
``midlayer.{hidden_norm,input_layernorm,post_attention_layernorm}.weight``, ``norm.weight``,
``lm_head.weight`` [draft_vocab_size, hidden_size] and the buffers ``t2d`` (bool [vocab_size])
and ``d2t`` (int64 [draft_vocab_size]), saved even when the vocabularies are equal. Its
config.json is a Llama config with ``architectures: ["LlamaForCausalLMEagle3"]``,
``draft_vocab_size``, optional ``target_hidden_size``, ``head_dim``, ``rope_theta`` and
``rope_scaling``, plus ``num_hidden_layers: 1`` (ignored).
The official EAGLE-3 layout has the same names without ``embed_tokens``.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from backend.errors import CheckpointError
from models.checkpoints import load_head, save_head
from models.heads.config import HeadKind
from models.heads.layers import rope_inverse_frequencies
from tests.engine.helpers import make_runner, run
from tests.factories import tiny_head, tiny_target

OFFICIAL_KEYS = {
    "fc.weight",
    "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight",
    "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
    "midlayer.input_layernorm.weight",
    "midlayer.hidden_norm.weight",
    "midlayer.post_attention_layernorm.weight",
    "norm.weight",
    "lm_head.weight",
    "d2t",
    "t2d",
}


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama", num_layers=8)


def specforge_dir(tmp_path, target, draft_vocab: int, with_embedding: bool = True):
    head = tiny_head("eagle3", target, draft_vocab_size=draft_vocab)
    state = {k: v.clone() for k, v in head.state_dict().items()}
    if "d2t" not in state:  # SpecForge saves the mapping even for equal vocabularies
        state["d2t"] = torch.zeros(draft_vocab, dtype=torch.long)
        state["t2d"] = torch.ones(target.config.vocab_size, dtype=torch.bool)
    if with_embedding:
        state["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().clone()
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_hidden_layers": 1,
        "vocab_size": target.config.vocab_size,
        "draft_vocab_size": draft_vocab,
        "target_hidden_size": 64,
        "rms_norm_eps": 1e-6,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file(state, str(tmp_path / "model.safetensors"))
    return head, state


def test_official_layout_round_trip(tmp_path, target) -> None:
    head = tiny_head("eagle3", target, draft_vocab_size=100)
    save_head(head, tmp_path)
    from safetensors.torch import load_file

    assert set(load_file(str(tmp_path / "model.safetensors"))) == OFFICIAL_KEYS
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    loaded = load_head(tmp_path)
    assert loaded.kind is HeadKind.EAGLE3
    assert torch.equal(loaded.d2t, head.d2t)
    ids = torch.arange(100)
    assert torch.equal(loaded.to_target_ids(ids), head.to_target_ids(ids))


@pytest.mark.parametrize("draft_vocab", [100, 256])
def test_specforge_layout_loads_and_generates(tmp_path, target, draft_vocab) -> None:
    head, state = specforge_dir(tmp_path, target, draft_vocab)
    loaded = load_head(tmp_path)
    assert loaded.kind is HeadKind.EAGLE3
    assert loaded.config.head_dim == 16 and loaded.config.rope_theta == 500000.0
    assert loaded.config.rope_scaling["rope_type"] == "llama3"
    assert torch.equal(loaded.embed_tokens.weight, state["embed_tokens.weight"])
    assert torch.equal(loaded.lm_head.weight, state["lm_head.weight"])
    loaded.bind_target(target.get_input_embeddings(), target.get_output_embeddings())
    runner, drafter = make_runner(target, loaded)
    eagle, _ = run(runner, drafter, [4, 8, 15, 16, 23, 42], mode="eagle", max_new_tokens=30)
    vanilla, _ = run(runner, drafter, [4, 8, 15, 16, 23, 42], mode="vanilla", max_new_tokens=30)
    assert eagle.token_ids == vanilla.token_ids


def test_llama3_rope_scaling_changes_only_low_frequencies(tmp_path, target) -> None:
    specforge_dir(tmp_path, target, 100)
    config = load_head(tmp_path).config
    scaled = rope_inverse_frequencies(config)
    config.rope_scaling = None
    plain = rope_inverse_frequencies(config)
    assert torch.isclose(scaled[0], plain[0])  # highest frequency untouched
    assert torch.isclose(scaled[-1], plain[-1] / 8.0)  # lowest divided by the factor


def test_reduced_vocab_without_d2t_is_a_clear_error(tmp_path, target) -> None:
    specforge_dir(tmp_path, target, 100)
    from safetensors.torch import load_file

    state = load_file(str(tmp_path / "model.safetensors"))
    del state["d2t"], state["t2d"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(
        CheckpointError, match="draft_vocab_size 100 is smaller than vocab_size 256"
    ):
        load_head(tmp_path)


def test_kind_comes_from_weights_not_flags(tmp_path, target) -> None:
    eagle1 = tiny_head("eagle1", target)
    save_head(eagle1, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["architectures"] = ["LlamaForCausalLMEagle3"]  # config lies about the kind
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        CheckpointError, match="describes an EAGLE-3 head but the weights are EAGLE-1"
    ):
        load_head(tmp_path)


def test_unsupported_rope_scaling_is_named(tmp_path, target) -> None:
    specforge_dir(tmp_path, target, 100)
    config = json.loads((tmp_path / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="unsupported rope_scaling type 'yarn'"):
        load_head(tmp_path)
