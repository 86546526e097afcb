"""The exported config.json carries every field other loaders read, and our loader honours the
fields they write: a head trained here must be read the same way everywhere."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from backend.errors import CheckpointError, IncompatibleHeadError
from backend.services.validate import check_head_fits_target
from models.checkpoints import load_head, save_head
from models.heads.config import HeadConfig, HeadKind
from tests.factories import tiny_head, tiny_target

DEMO = "assets/demo"


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama", num_layers=8)


def _saved(tmp_path, head, **kwargs) -> tuple[dict, dict]:
    save_head(head, tmp_path, **kwargs)
    config = json.loads((tmp_path / "config.json").read_text())
    return config, load_file(str(tmp_path / "model.safetensors"))


@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
def test_export_names_one_layer_untied_and_its_dtype(tmp_path, target, kind) -> None:
    config, _ = _saved(tmp_path, tiny_head(kind, target), dtype=torch.bfloat16)
    assert config["num_hidden_layers"] == 1
    assert config["tie_word_embeddings"] is False
    assert config["torch_dtype"] == "bfloat16"
    assert config["model_type"] == "llama"


def test_eagle3_without_embedding_leaves_out_target_hidden_size(tmp_path, target) -> None:
    config, state = _saved(tmp_path, tiny_head("eagle3", target, draft_vocab_size=100))
    assert "embed_tokens.weight" not in state
    assert "target_hidden_size" not in config  # the reference then takes the target's embedding
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]  # SGLang
    assert load_head(tmp_path).config.target_hidden_size == config["hidden_size"]


def test_eagle3_with_embedding_saves_it_and_says_so(tmp_path, target) -> None:
    head = tiny_head("eagle3", target, draft_vocab_size=100)
    config, state = _saved(tmp_path, head, include_embedding=True)
    assert config["target_hidden_size"] == 64
    assert torch.equal(state["embed_tokens.weight"], target.get_input_embeddings().weight)
    assert torch.equal(load_head(tmp_path).embed_tokens.weight, state["embed_tokens.weight"])


def test_rope_scaling_is_written_as_every_loader_reads_it(tmp_path, target) -> None:
    head = tiny_head("eagle1", target)
    head.config.rope_scaling = {"rope_type": "linear", "factor": 2.0}
    config, _ = _saved(tmp_path, head)
    assert config["rope_scaling"] == {"type": "linear", "factor": 2.0}  # the reference's 2 keys
    assert load_head(tmp_path).config.rope_scaling["rope_type"] == "linear"
    llama3 = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    head.config.rope_scaling = llama3
    config, _ = _saved(tmp_path, head)
    assert config["rope_scaling"] == {**llama3, "type": "llama3"}
    assert load_head(tmp_path).config.rope_scaling.items() >= llama3.items()


def test_reexport_keeps_weights_and_drops_stale_fields(tmp_path, target) -> None:
    head = tiny_head("eagle3", target, draft_vocab_size=100)
    save_head(head, tmp_path / "a", include_embedding=True)
    loaded = load_head(tmp_path / "a")
    config, state = _saved(tmp_path / "b", loaded)
    assert "target_hidden_size" not in config and "embed_tokens.weight" not in state
    for key, value in head.state_dict().items():
        assert torch.equal(state[key], value), key


def test_named_feature_layers_are_the_ones_read(tmp_path, target) -> None:
    head = tiny_head("eagle3", target)
    config = head.config.to_dict() | {"eagle_aux_hidden_state_layer_ids": [1, 3, 6]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_head(head, tmp_path / "weights")
    (tmp_path / "model.safetensors").write_bytes(
        (tmp_path / "weights" / "model.safetensors").read_bytes()
    )
    assert load_head(tmp_path).feature_layers(8) == (1, 3, 6)
    del config["eagle_aux_hidden_state_layer_ids"], config["eagle_config"]
    assert HeadConfig.from_dict(config, HeadKind.EAGLE3).eagle_aux_hidden_state_layer_ids is None
    assert load_head(tmp_path / "weights").feature_layers(8) == (2, 4, 5)


def test_speculators_style_eagle_config_is_read(target) -> None:
    config = tiny_head("eagle3", target).config.to_dict()
    del config["eagle_aux_hidden_state_layer_ids"]
    config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [0, 2, 7]}
    parsed = HeadConfig.from_dict(config, HeadKind.EAGLE3)
    assert parsed.eagle_aux_hidden_state_layer_ids == [0, 2, 7]


@pytest.mark.parametrize("bad", [[3, 2, 5], [-1, 2, 5], "2,4,5"])
def test_bad_feature_layers_are_named(target, bad) -> None:
    config = tiny_head("eagle3", target).config.to_dict() | {
        "eagle_aux_hidden_state_layer_ids": bad
    }
    with pytest.raises(CheckpointError, match="eagle_aux_hidden_state_layer_ids"):
        HeadConfig.from_dict(config, HeadKind.EAGLE3)


def test_feature_layers_beyond_the_target_are_rejected(target) -> None:
    config = tiny_head("eagle3", target).config
    config.eagle_aux_hidden_state_layer_ids = [2, 4, 8]
    with pytest.raises(IncompatibleHeadError, match=r"reads target layers \[2, 4, 8\]"):
        check_head_fits_target(config, target.config)


@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
def test_bundled_demo_heads_carry_what_other_loaders_read(kind) -> None:
    config = json.loads(open(f"{DEMO}/head-{kind}/config.json").read())
    target_layers = json.loads(open(f"{DEMO}/target/config.json").read())["num_hidden_layers"]
    assert config["num_hidden_layers"] == 1 and config["tie_word_embeddings"] is False
    assert config["torch_dtype"] == "bfloat16"
    if kind == "eagle3":
        assert "target_hidden_size" not in config
        assert config["eagle_aux_hidden_state_layer_ids"] == [
            2,
            target_layers // 2,
            target_layers - 3,
        ]
