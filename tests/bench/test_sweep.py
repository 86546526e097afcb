"""The prompt-length sweep: prompts lengthened to the asked size with the same passage, one bench
per length, and a table comparing the longest length with the shortest, end to end and
decoding alone."""

from __future__ import annotations

import dataclasses
import json

import pytest
from transformers import AutoTokenizer

from backend.bench.prompts import BenchPrompt, load_prompts
from backend.bench.report import label
from backend.bench.sweep import lengthen, run_sweep
from backend.errors import InputError
from tests.bench.test_report import hand_made

DEMO_TOKENIZER = "assets/demo/target"


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(DEMO_TOKENIZER)


def test_prompts_grow_to_the_asked_length_with_the_same_passage(tokenizer) -> None:
    prompts = load_prompts(limit=3)
    filler = " ".join(f"This is sentence {i} of the text in front." for i in range(400))
    for tokens in (64, 400):
        longer = lengthen(prompts, tokenizer, tokens, filler)
        lengths = [len(tokenizer(p.text, add_special_tokens=False)["input_ids"]) for p in longer]
        assert all(abs(n - tokens) <= 8 for n in lengths), (tokens, lengths)
        for short, long in zip(prompts, longer, strict=True):
            assert long.text.endswith(short.text)  # the question stays last
    passages = {p.text.split("\n\n")[0][:40] for p in lengthen(prompts, tokenizer, 400, filler)}
    assert len(passages) == 1  # one passage in front of every prompt: lengths compare fairly


def test_a_too_short_sweep_text_is_a_clear_error(tokenizer) -> None:
    with pytest.raises(InputError, match="--sweep-text"):
        lengthen([BenchPrompt("1", "x", "hi")], tokenizer, 500, "only a few words")


def test_one_bench_per_length_and_a_table_comparing_them(tmp_path) -> None:
    asked: list[int] = []

    def bench(prompts: list[BenchPrompt]):
        tokens = int(prompts[0].question_id.split("@")[1])
        asked.append(tokens)
        result = hand_made()
        slower = 2.0 if tokens > 100 else 1.0  # EAGLE decodes twice as slowly at the long length
        for prompt in result.prompts:
            eagle = prompt.runs["eagle"]
            decoding = (eagle.seconds - eagle.ttft_s) * slower
            prompt.runs["eagle"] = dataclasses.replace(eagle, seconds=eagle.ttft_s + decoding)
        result.settings["prompt_tokens_mean"] = tokens + 3
        return result

    def lengthen_to(prompts, tokens):
        return [dataclasses.replace(p, question_id=f"{p.question_id}@{tokens}") for p in prompts]

    points = run_sweep([512, 32], bench, load_prompts(limit=2), lengthen_to, tmp_path, "cmd")
    assert asked == [32, 512] and [p.prompt_tokens for p in points] == [32, 512]
    table = (tmp_path / "sweep.md").read_text()
    assert "| 35 |" in table and "| 515 |" in table
    # Whole replies: 0.5 s then 0.9 s (the prefill stays 0.1 s); decoding alone: half the speed.
    assert f"| {label('eagle')} | 56% | 50% |" in table
    rows = json.loads((tmp_path / "sweep.json").read_text())
    assert rows[1]["eagle"]["speedup"] == pytest.approx(rows[0]["eagle"]["speedup"] * 0.5 / 0.9)
    short, long = rows[0]["eagle"]["decode_speedup"], rows[1]["eagle"]["decode_speedup"]
    assert long == pytest.approx(short / 2)
    assert (tmp_path / "prompt-32" / "summary.md").is_file()
