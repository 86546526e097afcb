"""``--pair NAME`` in the commands that read a pair's files directly: ``train-head`` trains a
head of the pair's kind for its target, ``export-head`` rewrites the pair's head (reading its
target only when the export needs it), and both refuse ``--pair`` with ``--target``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from backend.errors import ConfigError
from backend.frontends import export_cli, train_cli

DEMO = Path(__file__).resolve().parents[1] / "assets" / "demo"


def parsed(module, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser.parse_args(argv)


def test_export_head_of_a_pair_equals_the_export_of_its_folders(tmp_path) -> None:
    by_pair = parsed(
        export_cli, ["--pair", "demo", "--out", str(tmp_path / "a"), "--with-embedding"]
    )
    by_path = parsed(
        export_cli,
        ["--head", str(DEMO / "head-eagle3"), "--target", str(DEMO / "target")]
        + ["--out", str(tmp_path / "b"), "--with-embedding"],
    )
    export_cli.export(by_pair)
    export_cli.export(by_path)
    a, b = (load_file(str(tmp_path / side / "model.safetensors")) for side in ("a", "b"))
    assert a.keys() == b.keys() and "embed_tokens.weight" in a
    assert all(torch.equal(a[key], b[key]) for key in a)
    configs = [json.loads((tmp_path / side / "config.json").read_text()) for side in "ab"]
    assert configs[0] == configs[1]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--out", "x"], "no head to export"),
        (["--pair", "demo", "--target", "t", "--out", "x"], "give --pair or --target"),
        (["--pair", "nope", "--out", "x"], "unknown pair 'nope'"),
        (["--head", "h", "--out", "x", "--fold-fc-bias"], "need --target (or --pair)"),
    ],
)
def test_export_head_names_what_is_missing(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        export_cli.export(parsed(export_cli, argv))


def test_train_head_takes_the_pairs_target_and_head_kind(tmp_path, capsys) -> None:
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"hi {i}"},
                {"role": "assistant", "content": "Hello!"},
            ]
        }
        for i in range(4)
    ]
    (tmp_path / "data.jsonl").write_text("\n".join(json.dumps(row) for row in rows))
    args = parsed(
        train_cli,
        ["--pair", "demo", "--data", str(tmp_path / "data.jsonl"), "--out", str(tmp_path / "head")]
        + ["--steps", "1", "--batch-size", "2", "--eval-prompts", "0", "--ttt-steps", "1"]
        + ["--draft-vocab-size", "64", "--device", "cpu", "--checkpoint-every", "0"],
    )
    assert train_cli.run(args) == 0
    assert capsys.readouterr().out.startswith("trained eagle3 head: 1 steps")
    config = json.loads((tmp_path / "head" / "config.json").read_text())
    target = json.loads((DEMO / "target" / "config.json").read_text())
    assert config["hidden_size"] == target["hidden_size"] and config["draft_vocab_size"] == 64


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--data", "d", "--out", "o"], "name the target and the head kind"),
        (["--target", "t", "--data", "d", "--out", "o"], "name the target and the head kind"),
        (["--pair", "demo", "--target", "t", "--data", "d", "--out", "o"], "not both"),
    ],
)
def test_train_head_names_what_is_missing(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        train_cli.target_and_kind(parsed(train_cli, argv))
