"""The make-demo and make-demo-target front ends: flags become the build's config, and bad
flags fail with a one-line message before any of the long build starts."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

import launch
from backend.frontends import demo_cli, demo_target_cli


def _never_build(config) -> None:
    raise AssertionError("the build must not start")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--kinds", "eagle1,eagle9"], "error: unknown head kinds: eagle9"),
        (["--data-dir", "MISSING"], "not found"),
    ],
)
def test_make_demo_rejects_bad_flags_before_building(
    tmp_path, monkeypatch, capsys, flags, message
) -> None:
    monkeypatch.setattr(demo_cli, "build_demo", _never_build)
    flags = [str(tmp_path / "missing") if f == "MISSING" else f for f in flags]
    code = launch.main(["make-demo", "--data-dir", str(tmp_path), *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err
    assert "Traceback" not in err


def test_make_demo_passes_its_flags_to_the_build(tmp_path, monkeypatch, capsys) -> None:
    seen = []
    monkeypatch.setattr(demo_cli, "build_demo", lambda config: seen.append(config) or tmp_path)
    code = launch.main(
        [
            "make-demo",
            "--data-dir",
            str(tmp_path),
            "--kinds",
            "eagle3",
            "--prompts",
            "7",
            "--finetune-epochs",
            "0",
            "--work",
            str(tmp_path / "w"),
            "--resume",
        ]
    )
    assert code == 0 and f"demo pair ready in {tmp_path}" in capsys.readouterr().out
    (config,) = seen
    assert config.kinds == ("eagle3",) and config.prompts == 7 and config.finetune_epochs == 0
    assert config.work == tmp_path / "w" and config.data_dir == tmp_path and config.resume
    assert config.sampled_prompts == 500 and not config.rebuild_target  # defaults kept


def _target_config(*flags: str):
    parser = argparse.ArgumentParser()
    demo_target_cli.add_arguments(parser)
    return demo_target_cli.build_config(parser.parse_args(list(flags)))


def test_make_demo_target_schedule_follows_minutes_unless_steps_are_given() -> None:
    default = _target_config()
    assert default.train.budget_seconds == 70 * 60 and default.train.steps is None
    assert _target_config("--minutes", "3").train.budget_seconds == 180
    stepped = _target_config("--steps", "40")
    assert stepped.train.steps == 40 and stepped.train.budget_seconds is None


def test_make_demo_target_flags_reach_every_part_of_the_config(tmp_path) -> None:
    config = _target_config(
        "--bench-dir",
        "",
        "--sources",
        "gsm8k, tinystories",
        "--seed",
        "3",
        "--layers",
        "2",
        "--no-export",
        "--work-dir",
        str(tmp_path),
        "--ckpt-minutes",
        "2",
    )
    assert config.data.bench_dir is None and config.data.sources == ("gsm8k", "tinystories")
    assert config.train.seed == 3 and config.train.ckpt_seconds == 120
    assert config.shape.layers == 2 and not config.export
    assert config.ckpt_path == Path(tmp_path) / "ckpt" / "last.pt"
