"""What loading checks and keeps: damaged weight files are one clear error naming the file
(issue 14.6), the head's RoPE frequencies stay float32 when it is cast (14.7), and ``d2t`` maps
draft ids to distinct target ids (14.14)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import launch
from backend.api import Backend
from backend.config import LoadConfig
from backend.errors import CheckpointError
from backend.events import LoadFailed
from models.checkpoints import load_head, save_head
from models.heads.layers import Rotary, rope_inverse_frequencies
from tests.factories import tiny_head, tiny_target, tiny_tokenizer


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("damaged")
    tokenizer = tiny_tokenizer(base / "target")
    target = tiny_target("llama", vocab_size=len(tokenizer), num_layers=8)
    target.save_pretrained(base / "target")
    save_head(tiny_head("eagle3", target, draft_vocab_size=100), base / "head")
    return base / "target", base / "head"


def damaged_copy(folder: Path, tmp_path: Path, how: str) -> Path:
    """A copy of ``folder`` whose model.safetensors is cut in half or replaced by noise."""
    copy = tmp_path / f"{folder.name}-{how}"
    copy.mkdir()
    for item in folder.iterdir():
        (copy / item.name).write_bytes(item.read_bytes())
    weights = copy / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if how == "truncated" else os.urandom(len(data)))
    return copy


@pytest.mark.parametrize("how", ["truncated", "garbage"])
def test_damaged_head_is_one_clear_error(pair_dirs, tmp_path, how) -> None:
    head = damaged_copy(pair_dirs[1], tmp_path, how)
    with pytest.raises(CheckpointError) as caught:
        load_head(head)
    assert str(head / "model.safetensors") in caught.value.message
    assert "download" in caught.value.hint


@pytest.mark.parametrize("how", ["truncated", "garbage"])
def test_damaged_files_in_the_cli_are_error_and_hint_lines(pair_dirs, tmp_path, capsys, how):
    target, head = pair_dirs
    for bad_target, bad_head in (
        (target, damaged_copy(head, tmp_path, how)),
        (damaged_copy(target, tmp_path, how), head),
    ):
        code = launch.main(
            [
                "generate",
                "--target",
                str(bad_target),
                "--head",
                str(bad_head),
                "--prompt",
                "hello",
                "--max-new-tokens",
                "2",
            ]
        )
        err = capsys.readouterr().err
        assert code == 2
        lines = [line for line in err.splitlines() if line.startswith(("error:", "hint:"))]
        assert len(lines) == 2 and "model.safetensors" in lines[0], err
        assert "download" in lines[1] and "Traceback" not in err


def test_damaged_target_in_the_app_is_a_load_failure_message(pair_dirs, tmp_path) -> None:
    target = damaged_copy(pair_dirs[0], tmp_path, "truncated")
    events = list(Backend().load(LoadConfig(target=str(target), head=str(pair_dirs[1]))))
    failed = events[-1]
    assert isinstance(failed, LoadFailed) and failed.code != "internal"
    assert str(target / "model.safetensors") in failed.message and "download" in failed.hint


def test_rope_frequencies_stay_float32_when_the_head_is_cast(pair_dirs) -> None:
    head = load_head(pair_dirs[1])
    exact = rope_inverse_frequencies(head.config)
    head = head.to(torch.bfloat16)
    assert head.fc.weight.dtype == torch.bfloat16
    assert head.rotary.inv_freq.dtype == torch.float32
    assert torch.equal(head.rotary.inv_freq, exact)
    positions = torch.arange(4000)[None]
    cos, sin = head.rotary(positions)
    reference = Rotary(head.config)
    cos32, sin32 = reference(positions)
    assert torch.allclose(cos, cos32, atol=1e-5) and torch.allclose(sin, sin32, atol=1e-5)
    bf16_angles = positions[..., None].float() * exact.to(torch.bfloat16).float()
    assert (bf16_angles - positions[..., None] * exact).abs().max() > 0.1  # what a cast costs


def rewrite_d2t(head_dir: Path, change) -> None:
    state = load_file(str(head_dir / "model.safetensors"))
    change(state["d2t"])
    save_file(state, str(head_dir / "model.safetensors"))


def test_d2t_mapping_two_draft_ids_to_one_target_id_is_refused(pair_dirs, tmp_path) -> None:
    head = damaged_copy(pair_dirs[1], tmp_path, "copy")
    save_head(load_head(pair_dirs[1]), head)  # restore the copy's weights
    ids = load_head(head).to_target_ids(torch.arange(100))
    offset = int(ids[6] - 5)  # draft id 5 now lands on draft id 6's target id

    rewrite_d2t(head, lambda d2t: d2t.__setitem__(5, offset))
    with pytest.raises(CheckpointError, match=r"draft ids \[5, 6\] to the same target id"):
        load_head(head)


def test_d2t_outside_the_target_vocabulary_is_refused(pair_dirs, tmp_path) -> None:
    head = damaged_copy(pair_dirs[1], tmp_path, "copy")
    save_head(load_head(pair_dirs[1]), head)
    rewrite_d2t(head, lambda d2t: d2t.__setitem__(99, 10_000))
    with pytest.raises(CheckpointError, match="outside the target vocabulary") as caught:
        load_head(head)
    assert caught.value.hint
