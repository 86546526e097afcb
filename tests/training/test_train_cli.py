"""train-head on plain text: a held-out share never trained on and written as bench prompts,
the target's own continuations, cached features, the held-out tau curve beside the head, a
resume that reuses all of them, and an evaluation that gives the bench's tau."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from backend.bench.prompts import load_prompts
from backend.bench.report import summarize
from backend.bench.runner import BenchSpec, run_bench
from backend.config import LoadConfig, TreeConfig
from backend.frontends import train_cli
from backend.services.loading import load_pair
from models.checkpoints import save_head
from models.training import continuations
from models.training.data import held_out_units, is_held_out, load_documents
from tests.factories import easy_llama_pair, tiny_target, tiny_tokenizer

WORDS = "the quick brown fox jumps over the lazy dog and the world says hello".split()


def _text_files(directory: Path) -> list[str]:
    lines = [
        f"line {i}: " + " ".join(WORDS[(i * 3 + j) % len(WORDS)] for j in range(8 + i % 5))
        for i in range(40)
    ]
    (directory / "wiki.txt").write_text("\n".join(lines) + "\n")
    records = [
        {"text": f"page {i}. " + " ".join(WORDS[(i + j) % len(WORDS)] for j in range(12))}
        for i in range(20)
    ]
    (directory / "web.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return [str(directory / "wiki.txt"), str(directory / "web.jsonl")]


def test_held_out_units_are_chosen_by_content_and_never_trained_on(tmp_path):
    files = _text_files(tmp_path)
    for path in files:
        held = held_out_units(path, 0.3)
        assert 0 < len(held) < 20 and held == held_out_units(path, 0.3)
        trained = "\n".join(d[0]["content"] for d in load_documents(path, 200, 0.3))
        kept = "\n".join(d[0]["content"] for d in load_documents(path, 200, 0.0))
        assert all(unit not in trained for unit in held) and all(unit in kept for unit in held)
    # the choice depends on a unit's text alone: not on its position or its neighbours
    assert is_held_out("a line of text", 0.5) == is_held_out("a line of text", 0.5)
    shares = [sum(is_held_out(f"unit {i}", s) for i in range(2000)) / 2000 for s in (0.05, 0.5)]
    assert abs(shares[0] - 0.05) < 0.02 and abs(shares[1] - 0.5) < 0.05
    assert not is_held_out("anything", 0.0) and not is_held_out("   ", 1.0)


def _parse(arguments: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    train_cli.add_arguments(parser)
    return parser.parse_args(arguments)


def test_text_training_with_continuations_cache_and_curve_resumes(tmp_path, capsys, monkeypatch):
    tokenizer = tiny_tokenizer(tmp_path / "target")
    tiny_target(vocab_size=len(tokenizer), num_layers=8).save_pretrained(tmp_path / "target")
    files = _text_files(tmp_path)
    out = tmp_path / "head"
    args = _parse(
        ["--target", str(tmp_path / "target"), "--text", "--data", *files, "--kind", "eagle3"]
        + ["--out", str(out), "--epochs", "2", "--batch-size", "2", "--max-length", "48"]
        + ["--regenerate", "--regen-max-new-tokens", "6", "--regen-prompts", "8"]
        + ["--regen-sampled-share", "0.5", "--regen-temperature", "1.0"]
        + ["--regen-prompt-chars", "40", "--held-out-share", "0.3", "--held-out-continued", "2"]
        + ["--cache-features", str(tmp_path / "cache"), "--draft-vocab-size", "64"]
        + ["--ttt-steps", "2", "--eval-every", "2", "--eval-prompts", "2"]
        + ["--eval-max-new-tokens", "6", "--eval-tree", "8/3/2", "--checkpoint-every", "2"]
        + ["--device", "cpu"]
    )
    assert train_cli.run(args) == 0
    assert capsys.readouterr().out.startswith("trained eagle3 head: 8 steps")
    held_out = load_prompts(out / train_cli.HELD_OUT_NAME)
    assert {p.category for p in held_out} == {"wiki", "web"}
    assert held_out[0].category != held_out[1].category  # the files interleave
    wiki = load_prompts(out / "held_out-wiki.jsonl")
    assert wiki == [p for p in held_out if p.category == "wiki"]
    continued = load_prompts(out / "held_out-continued.jsonl")  # passage + the target's own
    assert [p.text[: len(h.text)] for p, h in zip(continued, held_out)] == [
        h.text for h in held_out[:2]
    ]
    assert all(len(p.text) > len(h.text) for p, h in zip(continued, held_out))
    made = [
        json.loads(line) for line in (out / train_cli.CONTINUATIONS_NAME).read_text().splitlines()
    ]
    assert len(made) == 8 and sum(r["sampled"] for r in made) == 4
    held_texts = [unit for path in files for unit in held_out_units(path, 0.3)]
    assert not any(unit in record["prompt"] for record in made for unit in held_texts)
    curve = json.loads((out / "eval_curve.json").read_text())
    assert [p["step"] for p in curve["points"]] == [2, 4, 6, 8]
    assert curve["points"][-1]["tokens"] > curve["points"][0]["tokens"] > 0
    assert (
        curve["data"]["regenerated"]["sampled_share"] == 0.5 and (out / "eval_curve.png").is_file()
    )
    assert (tmp_path / "cache" / "manifest.json").is_file()
    # a longer run resumes: the continuations and the cache are read back, the curve goes on
    monkeypatch.setattr(continuations, "_generate", pytest.fail)
    args.resume, args.epochs = True, 3
    assert train_cli.run(args) == 0
    assert capsys.readouterr().out.startswith("trained eagle3 head: 12 steps")
    points = json.loads((out / "eval_curve.json").read_text())["points"]
    assert [p["step"] for p in points] == [2, 4, 6, 8, 10, 12]
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["timing"]["batches_from"] == "cache" and summary["timing"]["cache_fill_s"] == 0


def test_eval_head_measures_the_tau_the_bench_measures(tmp_path, capsys):
    """The same head on the same prompts and fixed tree: train-head's number is the bench's."""
    tokenizer = tiny_tokenizer(tmp_path / "target")
    target, head = easy_llama_pair(vocab_size=len(tokenizer), num_layers=8)
    target.save_pretrained(tmp_path / "target")
    save_head(head, tmp_path / "head")
    questions = [
        {"question_id": i, "turns": [t]} for i, t in enumerate(["the fox", "hello", "a b"])
    ]
    prompt_file = tmp_path / "prompts.jsonl"
    prompt_file.write_text("".join(json.dumps(q) + "\n" for q in questions))
    args = _parse(
        ["--target", str(tmp_path / "target"), "--eval-head", str(tmp_path / "head")]
        + ["--eval-prompt-file", str(prompt_file), "--eval-prompts", "3"]
        + ["--eval-max-new-tokens", "24", "--eval-tree", "16/5/4", "--device", "cpu"]
    )
    assert train_cli.run(args) == 0
    line = capsys.readouterr().out
    tau = float(re.match(r"tau ([0-9.]+) on 3 prompts", line).group(1))
    pair = load_pair(LoadConfig(target=str(tmp_path / "target"), head=str(tmp_path / "head")))
    spec = BenchSpec(
        max_new_tokens=24, tree=TreeConfig(16, 5, 4), methods=("vanilla", "eagle"), repeats=1
    )
    bench = summarize(run_bench(pair, load_prompts(prompt_file), spec))["eagle"]
    assert tau > 1.5 and abs(tau - bench.tau) <= 0.05, (tau, bench.tau)
