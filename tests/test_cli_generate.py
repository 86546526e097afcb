"""``launch.py generate`` end to end on a tiny saved target + head, and its error handling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from models.checkpoints import save_head
from tests.factories import tiny_head, tiny_target, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def saved_pair(tmp_path_factory) -> tuple[Path, Path, Path]:
    base = tmp_path_factory.mktemp("pair")
    tokenizer = tiny_tokenizer(base / "target")
    target = tiny_target("qwen3", vocab_size=len(tokenizer), num_layers=8)
    target.generation_config.eos_token_id = tokenizer.eos_token_id
    target.save_pretrained(base / "target")
    save_head(tiny_head("eagle1", target), base / "head1")
    save_head(tiny_head("eagle3", target, draft_vocab_size=120), base / "head3")
    return base / "target", base / "head1", base / "head3"


def cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, str(ROOT / "launch.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )


@pytest.mark.parametrize("head_name", ["head1", "head3"])
def test_json_output_and_identity(saved_pair, head_name) -> None:
    target, head1, head3 = saved_pair
    head = head1 if head_name == "head1" else head3
    common = [
        "generate",
        "--target",
        str(target),
        "--head",
        str(head),
        "--prompt",
        "hello world",
        "--max-new-tokens",
        "24",
        "--json",
    ]
    eagle = cli(*common)
    assert eagle.returncode == 0, eagle.stderr
    data = json.loads(eagle.stdout.strip().splitlines()[-1])
    for key in (
        "mode",
        "text",
        "token_ids",
        "new_tokens",
        "rounds",
        "acceptance_lengths",
        "tau",
        "tokens_per_s",
    ):
        assert key in data, key
    assert data["mode"] == "eagle"
    assert data["new_tokens"] == len(data["token_ids"]) <= 24
    assert len(data["acceptance_lengths"]) == data["rounds"]
    vanilla = json.loads(cli(*common, "--mode", "vanilla").stdout.strip().splitlines()[-1])
    assert vanilla["token_ids"] == data["token_ids"]
    assert vanilla["text"] == data["text"]
    assert vanilla["tau"] == 1.0


def test_race_runs_both_lanes_and_says_whether_the_texts_are_identical(saved_pair) -> None:
    target, _, head3 = saved_pair
    common = ["generate", "--target", str(target), "--head", str(head3), "--prompt", "hello"]
    raced = cli(*common, "--max-new-tokens", "20", "--race", "--json")
    assert raced.returncode == 0, raced.stderr
    data = json.loads(raced.stdout.strip().splitlines()[-1])
    assert data["identical"] is True and data["first_divergence"] is None
    assert data["vanilla"]["token_ids"] == data["eagle"]["token_ids"]
    assert data["vanilla"]["tau"] == 1.0 and data["eagle"]["new_tokens"] <= 20
    expected = data["eagle"]["tokens_per_s"] / data["vanilla"]["tokens_per_s"]
    assert data["speedup"] == pytest.approx(expected, rel=1e-6)
    spoken = cli(*common, "--max-new-tokens", "12", "--race")
    assert spoken.returncode == 0, spoken.stderr
    assert "[race] vanilla" in spoken.stderr and "texts identical" in spoken.stderr
    refused = cli(*common, "--race", "--raw")
    assert refused.returncode == 2 and "drop --raw" in refused.stderr


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--prompt", "   "], "the prompt is empty"),
        (["--prompt", "hi", "--max-new-tokens", "0"], "max_new_tokens must be a positive"),
        (["--prompt", "hi", "--max-new-tokens", "-3"], "max_new_tokens must be a positive"),
        (["--prompt", "hi", "--depth", "0"], "tree depth must be >= 1"),
        (["--prompt", "hi", "--total-tokens", "500"], "tree total_tokens=500 exceeds what depth"),
        (["--prompt", "hi", "--temperature", "-1"], "temperature must be >= 0"),
        (["--prompt", "hello " * 600], "the model's context is 512"),
        (["--prompt", "hi", "--stop", ""], "stop strings must be non-empty"),
        (["--prompt", "hi", "--pair", "demo"], "give --pair or --target, not both"),
    ],
)
def test_bad_input_is_a_clear_error(saved_pair, extra, message) -> None:
    target, head1, _ = saved_pair
    result = cli("generate", "--target", str(target), "--head", str(head1), *extra)
    assert result.returncode == 2
    assert "error: " in result.stderr and message in result.stderr
    assert "Traceback" not in result.stderr


def test_mismatched_head_is_a_clear_error(saved_pair, tmp_path) -> None:
    target, _, _ = saved_pair
    other = tiny_target("llama", vocab_size=1000, num_layers=8)
    save_head(tiny_head("eagle1", other), tmp_path / "other")
    result = cli(
        "generate", "--target", str(target), "--head", str(tmp_path / "other"), "--prompt", "hi"
    )
    assert result.returncode == 2
    assert "vocabulary size: head 1000 vs target" in result.stderr


def test_stop_strings_end_the_reply_right_before_the_first() -> None:
    """``--stop`` (repeatable) on the demo pair: the reply is cut before the earliest one."""
    common = ["generate", "--pair", "demo", "--prompt", "Hello! Who are you?", "--json"]
    free = cli(*common)
    assert free.returncode == 0, free.stderr
    text = json.loads(free.stdout.strip().splitlines()[-1])["text"]
    words = text.split()
    assert len(words) >= 4, text
    late, early = words[-2], words[1]
    stopped = cli(*common, "--stop", late, "--stop", early)
    assert stopped.returncode == 0, stopped.stderr
    data = json.loads(stopped.stdout.strip().splitlines()[-1])
    cut = min(text.find(late), text.find(early))
    assert data["text"] == text[:cut]
    assert data["stop_reason"] == "stop_string"
    assert data["stopped_by"] in (late, early) and text[cut:].startswith(data["stopped_by"])
