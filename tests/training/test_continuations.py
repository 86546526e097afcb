"""The target's own continuations of text prompts: batched generation gives what one prompt at a
time gives, the sampled share is sampled and reproducible, an interrupted run continues with its
first unfinished batch, and a file made from other prompts is refused."""

from __future__ import annotations

import pytest
import torch

from backend.errors import ConfigError
from models.chat_format import plain_text_ids
from models.training import continuations
from models.training.continuations import (
    ContinuationOptions,
    batch_plan,
    continue_prompts,
    cut_prompts,
    read_continuations,
)
from tests.factories import tiny_target, tiny_tokenizer
from tests.training.interruptions import fails_on_call

PASSAGES = [
    "the quick brown fox",
    "hello world, the lazy dog",
    "once upon a time",
    "the fox",
    "lazy dog. the quick",
    "hello",
    "world of the fox and the dog",
]


@pytest.fixture(scope="module")
def pair():
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = None  # a base model: plain text
    return tiny_target(vocab_size=len(tokenizer), num_layers=2), tokenizer


def test_batched_greedy_continuations_equal_one_prompt_at_a_time(pair, tmp_path):
    model, tokenizer = pair
    options = ContinuationOptions(max_new_tokens=6, sampled_share=0.0, batch_size=3)
    prompts = cut_prompts(tokenizer, PASSAGES, options)
    assert [p.ids for p in prompts] == [plain_text_ids(tokenizer, text) for text in PASSAGES]
    assert len({len(p.ids) for p in prompts}) > 1  # the batches need left padding
    made = continue_prompts(model, tokenizer, prompts, options, tmp_path / "c.jsonl")
    assert [c.index for c in made] == list(range(len(PASSAGES)))
    for prompt, continuation in zip(prompts, made):
        alone = model.generate(
            input_ids=torch.tensor([prompt.ids]),
            attention_mask=torch.ones(1, len(prompt.ids), dtype=torch.long),
            max_new_tokens=6,
            do_sample=False,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )[0, len(prompt.ids) :].tolist()
        end = alone.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in alone else 6
        assert continuation.new_ids == alone[:end]
        special = prompt.ids[0]  # as if it were a BOS: only the prompt's special tokens untrained
        example = continuation.example([special])
        assert example.input_ids == prompt.ids + continuation.new_ids
        expected = [int(t != special) for t in prompt.ids] + [1] * len(continuation.new_ids)
        assert example.loss_mask == expected


def test_sampled_share_is_sampled_reproducibly_and_batched_apart(pair, tmp_path):
    model, tokenizer = pair
    options = ContinuationOptions(
        max_new_tokens=8, sampled_share=0.5, temperature=1.5, batch_size=2, seed=3
    )
    prompts = cut_prompts(tokenizer, PASSAGES, options)
    assert sum(p.sampled for p in prompts) == round(0.5 * len(PASSAGES))
    assert all(len({p.sampled for p in batch}) == 1 for batch in batch_plan(prompts, 2))
    first = continue_prompts(model, tokenizer, prompts, options, tmp_path / "a.jsonl")
    again = continue_prompts(model, tokenizer, prompts, options, tmp_path / "b.jsonl")
    assert first == again
    greedy = ContinuationOptions(max_new_tokens=8, sampled_share=0.0, batch_size=2, seed=3)
    plain = continue_prompts(
        model, tokenizer, cut_prompts(tokenizer, PASSAGES, greedy), greedy, tmp_path / "g.jsonl"
    )
    differs = [a.new_ids != b.new_ids for a, b in zip(first, plain)]
    assert any(differs) and not any(d for d, p in zip(differs, prompts) if not p.sampled)
    limited = cut_prompts(tokenizer, PASSAGES, ContinuationOptions(max_prompts=3, seed=1))
    assert len(limited) == 3 and limited == cut_prompts(
        tokenizer, PASSAGES, ContinuationOptions(max_prompts=3, seed=1)
    )


def test_an_interrupted_run_continues_with_its_first_unfinished_batch(pair, tmp_path, monkeypatch):
    model, tokenizer = pair
    options = ContinuationOptions(
        max_new_tokens=5, sampled_share=0.5, temperature=1.0, batch_size=2
    )
    prompts = cut_prompts(tokenizer, PASSAGES, options)
    straight = continue_prompts(model, tokenizer, prompts, options, tmp_path / "straight.jsonl")
    path = tmp_path / "stopped.jsonl"
    original = continuations._generate
    monkeypatch.setattr(continuations, "_generate", fails_on_call(original, 3))
    with pytest.raises(KeyboardInterrupt):
        continue_prompts(model, tokenizer, prompts, options, path)
    plan = batch_plan(prompts, 2)
    assert len(read_continuations(path, prompts)) == len(plan[0]) + len(plan[1])
    with path.open("a") as file:
        file.write('{"index": 5, "prom')  # a torn last line is ignored
    batches = []
    monkeypatch.setattr(
        continuations, "_generate", lambda *args: batches.append(args) or original(*args)
    )
    resumed = continue_prompts(model, tokenizer, prompts, options, path)
    assert len(batches) == len(plan) - 2  # only the unfinished batches ran
    assert resumed == straight
    others = cut_prompts(tokenizer, PASSAGES[::-1], options)
    with pytest.raises(ConfigError, match="other prompts"):
        continue_prompts(model, tokenizer, others, options, path)
    with pytest.raises(ConfigError):
        ContinuationOptions(sampled_share=0.5, temperature=0.0)
