"""Strict head checkpoints: round trips in both file formats, and clear errors that name the
offending keys, shapes and values."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from backend.errors import CheckpointError, IncompatibleHeadError
from backend.services.validate import check_head_fits_target
from models.checkpoints import load_head, save_head
from models.heads.config import HeadKind
from tests.factories import tiny_head, tiny_target

EAGLE1_KEYS = {
    "fc.weight",
    "fc.bias",
    "layers.0.self_attn.q_proj.weight",
    "layers.0.self_attn.k_proj.weight",
    "layers.0.self_attn.v_proj.weight",
    "layers.0.self_attn.o_proj.weight",
    "layers.0.mlp.gate_proj.weight",
    "layers.0.mlp.up_proj.weight",
    "layers.0.mlp.down_proj.weight",
    "layers.0.post_attention_layernorm.weight",
}


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama", num_layers=8)


def test_eagle1_round_trip_uses_the_official_key_names(tmp_path, target) -> None:
    head = tiny_head("eagle1", target)
    save_head(head, tmp_path)
    assert set(load_file(str(tmp_path / "model.safetensors"))) == EAGLE1_KEYS
    loaded = load_head(tmp_path)
    assert loaded.kind is HeadKind.EAGLE1
    for key, value in head.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[key]), key


def test_pickle_checkpoint_with_embedding_and_no_bias(tmp_path, target) -> None:
    head = tiny_head("eagle1", target)
    state = {k: v for k, v in head.state_dict().items() if k != "fc.bias"}
    state["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().clone()
    config = head.config.to_dict() | {"bias": False}
    (tmp_path / "config.json").write_text(json.dumps(config))
    torch.save(state, tmp_path / "pytorch_model.bin")
    loaded = load_head(tmp_path)
    assert loaded.fc.bias is None
    assert torch.equal(loaded.embed_tokens.weight, state["embed_tokens.weight"])


def test_qkv_bias_heads_load(tmp_path, target) -> None:
    head = tiny_head("eagle1", target)
    config = head.config.to_dict() | {"qkv_bias": True}
    state = dict(head.state_dict())
    for name in ("q_proj", "k_proj", "v_proj"):
        rows = state[f"layers.0.self_attn.{name}.weight"].shape[0]
        state[f"layers.0.self_attn.{name}.bias"] = torch.randn(rows)
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file(state, str(tmp_path / "model.safetensors"))
    assert load_head(tmp_path).layers[0].self_attn.q_proj.bias is not None


def _write(tmp_path, config: dict, state: dict) -> None:
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "model.safetensors"))


def test_missing_key_is_named(tmp_path, target) -> None:
    head = tiny_head("eagle1", target)
    state = dict(head.state_dict())
    del state["layers.0.mlp.up_proj.weight"]
    _write(tmp_path, head.config.to_dict(), state)
    with pytest.raises(CheckpointError, match=r"missing keys: layers\.0\.mlp\.up_proj\.weight"):
        load_head(tmp_path)


def test_unexpected_key_is_named(tmp_path, target) -> None:
    head = tiny_head("eagle1", target)
    state = dict(head.state_dict()) | {"layers.0.extra.weight": torch.zeros(2)}
    _write(tmp_path, head.config.to_dict(), state)
    with pytest.raises(CheckpointError, match=r"unexpected keys: layers\.0\.extra\.weight"):
        load_head(tmp_path)


def test_wrong_shape_is_named(tmp_path, target) -> None:
    head = tiny_head("eagle1", target)
    config = head.config.to_dict() | {"intermediate_size": 96}
    _write(tmp_path, config, head.state_dict())
    with pytest.raises(CheckpointError, match=r"wrong shapes: layers\.0\.mlp\.down_proj\.weight"):
        load_head(tmp_path)


def test_no_weights_file_and_no_config(tmp_path) -> None:
    with pytest.raises(CheckpointError, match="no config.json"):
        load_head(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="no model.safetensors or pytorch_model.bin"):
        load_head(tmp_path)


def test_a_full_model_is_not_a_head(tmp_path) -> None:
    model = tiny_target("llama", num_layers=2)
    model.save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="looks like a full model"):
        load_head(tmp_path)


@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
def test_head_for_another_target_is_rejected_with_both_values(tmp_path, target, kind) -> None:
    other = tiny_target("llama", vocab_size=300, num_layers=8)
    head = tiny_head(kind, other)
    with pytest.raises(IncompatibleHeadError, match="vocabulary size: head 300 vs target 256"):
        check_head_fits_target(head.config, target.config)
    wide = tiny_target("llama", num_layers=8)
    wide.config.hidden_size = 96
    with pytest.raises(IncompatibleHeadError, match="64.*96"):
        check_head_fits_target(tiny_head(kind, target).config, wide.config)


def test_eagle3_needs_seven_target_layers(target) -> None:
    shallow = tiny_target("llama", num_layers=4)
    with pytest.raises(IncompatibleHeadError, match="at least 7 layers, target has 4"):
        check_head_fits_target(tiny_head("eagle3", target).config, shallow.config)
