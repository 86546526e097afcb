"""Folding an EAGLE-1/2 head's fc bias into a head-owned embedding keeps its drafts exactly,
and the export command writes that head so loaders without an fc bias (vLLM) read it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from backend.errors import CheckpointError
from backend.frontends.export_cli import export
from models.checkpoints import load_head, save_head
from models.heads.fc_bias_fold import fold_fc_bias
from tests.factories import tiny_head, tiny_target

DEMO = Path(__file__).resolve().parents[2] / "assets" / "demo"


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama", num_layers=4)


def _head_outputs(head, hidden, token_ids) -> torch.Tensor:
    positions = torch.arange(token_ids.shape[1])[None]
    with torch.no_grad():
        return head(hidden, token_ids, positions, None, None)


def test_folded_head_computes_the_same_features(target) -> None:
    head = tiny_head("eagle1", target)
    with torch.no_grad():
        head.fc.bias.normal_(0, 0.5)  # a bias large enough to matter
    embedding = target.get_input_embeddings().weight
    folded = fold_fc_bias(head, embedding)
    folded.bind_target(target.get_input_embeddings(), target.get_output_embeddings())
    assert folded.fc.bias is None and folded.config.bias is False
    hidden = torch.randn(1, 12, 64)
    token_ids = torch.randint(0, 256, (1, 12))
    expected = _head_outputs(head, hidden, token_ids)
    assert torch.allclose(_head_outputs(folded, hidden, token_ids), expected, atol=1e-5)
    without_bias = tiny_head("eagle1", target)
    without_bias.load_state_dict(head.state_dict() | {"fc.bias": torch.zeros(64)})
    assert not torch.allclose(_head_outputs(without_bias, hidden, token_ids), expected, atol=1e-3)


def test_singular_embedding_half_is_refused(target) -> None:
    head = tiny_head("eagle1", target)
    with torch.no_grad():
        head.fc.weight[:, :64] = 0.0  # the embedding half cannot produce any shift
        head.fc.bias.fill_(1.0)
    with pytest.raises(CheckpointError, match="singular"):
        fold_fc_bias(head, target.get_input_embeddings().weight)


def test_only_eagle1_heads_with_a_bias_fold(target) -> None:
    embedding = target.get_input_embeddings().weight
    with pytest.raises(CheckpointError, match="only EAGLE-1/2"):
        fold_fc_bias(tiny_head("eagle3", tiny_target("llama", num_layers=8)), embedding)
    head = tiny_head("eagle1", target)
    head.config.bias = False
    no_bias = type(head)(head.config)
    with pytest.raises(CheckpointError, match="no fc bias"):
        fold_fc_bias(no_bias, embedding)


def _args(**values) -> argparse.Namespace:
    defaults = dict(pair=None, target=None, fold_fc_bias=False, with_embedding=False, dtype=None)
    return argparse.Namespace(**(defaults | values))


def test_export_folds_the_demo_head_for_vllm(tmp_path) -> None:
    export(
        _args(
            head=str(DEMO / "head-eagle1"),
            out=str(tmp_path),
            target=str(DEMO / "target"),
            fold_fc_bias=True,
        )
    )
    config = json.loads((tmp_path / "config.json").read_text())
    state = load_file(str(tmp_path / "model.safetensors"))
    assert config["bias"] is False and "fc.bias" not in state
    assert state["embed_tokens.weight"].shape == (4096, 192)
    assert config["torch_dtype"] == "float32"
    assert load_head(tmp_path).embed_tokens is not None


def test_export_names_the_feature_layers_of_an_old_eagle3_head(tmp_path) -> None:
    target = tiny_target("llama", num_layers=8)
    target.save_pretrained(tmp_path / "target")
    head = tiny_head("eagle3", target)
    head.config.eagle_aux_hidden_state_layer_ids = None  # as heads exported before they were named
    save_head(head, tmp_path / "old", dtype=torch.bfloat16)
    export(
        _args(
            head=str(tmp_path / "old"), out=str(tmp_path / "new"), target=str(tmp_path / "target")
        )
    )
    config = json.loads((tmp_path / "new" / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert config["torch_dtype"] == "bfloat16"  # the head's own dtype is kept
    old, new = (
        load_file(str(tmp_path / "old" / "model.safetensors")),
        load_file(str(tmp_path / "new" / "model.safetensors")),
    )
    assert all(torch.equal(old[k], new[k]) for k in old)


def test_export_with_embedding_copies_the_targets_and_says_so(tmp_path) -> None:
    export(
        _args(
            head=str(DEMO / "head-eagle3"),
            out=str(tmp_path),
            target=str(DEMO / "target"),
            with_embedding=True,
        )
    )
    config = json.loads((tmp_path / "config.json").read_text())
    state = load_file(str(tmp_path / "model.safetensors"))
    target_state = load_file(str(DEMO / "target" / "model.safetensors"))
    assert config["target_hidden_size"] == config["hidden_size"]
    assert torch.equal(state["embed_tokens.weight"], target_state["model.embed_tokens.weight"])
    original = load_file(str(DEMO / "head-eagle3" / "model.safetensors"))
    assert all(torch.equal(original[k], state[k]) for k in original)
