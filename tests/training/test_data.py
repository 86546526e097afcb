"""Training data: file formats, assistant-only loss mask, held-out split, regeneration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from backend.errors import ConfigError, InputError
from models.chat_format import encode_prompt, plain_completion_ids
from models.training.data import (
    RegenerateOptions,
    load_conversations,
    load_documents,
    prompt_messages,
    regenerate_replies,
    split_held_out,
    tokenize_conversation,
    tokenize_conversations,
)
from tests.factories import tiny_target, tiny_tokenizer

CONVERSATION = [
    {"role": "system", "content": "be nice"},
    {"role": "user", "content": "hello world"},
    {"role": "assistant", "content": "the fox"},
    {"role": "user", "content": "ok"},
    {"role": "assistant", "content": "lazy dog."},
]


def _masked_text(tokenizer, example) -> str:
    return tokenizer.decode([t for t, m in zip(example.input_ids, example.loss_mask) if m])


def test_loss_mask_covers_exactly_the_assistant_replies():
    tokenizer = tiny_tokenizer()
    example = tokenize_conversation(tokenizer, CONVERSATION, max_length=1000)
    templated = tokenizer.apply_chat_template(CONVERSATION, tokenize=True)["input_ids"]
    assert example.input_ids == list(templated)  # the same tokens the target sees at inference
    assert _masked_text(tokenizer, example) == "the fox<|end|>lazy dog.<|end|>"
    unmasked = [t for t, m in zip(example.input_ids, example.loss_mask) if not m]
    assert "<|assistant|>" in tokenizer.decode(unmasked)  # the generation prompt is not a reply
    assert "hello world" in tokenizer.decode(unmasked)
    # the mask switches on right after each "<|assistant|>" and off after each reply's end token
    assistant_id = tokenizer.convert_tokens_to_ids("<|assistant|>")
    for index, token in enumerate(example.input_ids):
        if token == assistant_id:
            assert example.loss_mask[index] == 0 and example.loss_mask[index + 1] == 1


def test_plain_completion_without_chat_template_and_truncation():
    """Base models: the texts continue each other (a new prompt after a reply on a new line),
    tokenised once with the tokenizer's own special tokens; only reply tokens carry loss; the
    serving prompt is the same encoding."""
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = None
    example = tokenize_conversation(tokenizer, CONVERSATION, max_length=1000)
    text = "hello worldthe fox\noklazy dog."
    assert example.input_ids == tokenizer(text, add_special_tokens=True)["input_ids"]
    decoded = [tokenizer.decode([t]) for t, m in zip(example.input_ids, example.loss_mask) if m]
    assert "".join(decoded) == "the foxlazy dog."
    assert (
        encode_prompt(tokenizer, CONVERSATION[:4])
        == tokenizer("hello worldthe fox\nok", add_special_tokens=True)["input_ids"]
    )
    # serving's prompt encoding and training's tokenisation of the same turns agree
    prompt_example = tokenize_conversation(tokenizer, CONVERSATION[:4], max_length=1000)
    assert plain_completion_ids(tokenizer, CONVERSATION[:4]) == prompt_example.input_ids
    cut = tokenize_conversation(tokenizer, CONVERSATION, max_length=5)
    assert cut.input_ids == example.input_ids[:5]
    assert cut.loss_mask == example.loss_mask[:5]


def test_text_documents_train_every_token(tmp_path: Path):
    lines = ["Once upon a time there was a fox.", "It ran. " * 40, "", "The end of it all."]
    path = tmp_path / "stories.txt"
    path.write_text("\n".join(lines))
    documents = load_documents(path, max_chars=120)
    assert all(len(d) == 1 and d[0]["role"] == "assistant" for d in documents)
    texts = [d[0]["content"] for d in documents]
    assert all(len(t) <= 120 for t in texts) and texts[0].startswith("Once upon a time")
    assert "".join(texts).replace(" ", "").replace("\n", "") == "".join(lines).replace(" ", "")
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = None
    example = tokenize_conversation(tokenizer, documents[0], max_length=1000)
    assert all(example.loss_mask)


def test_prompt_only_data_needs_regeneration():
    tokenizer = tiny_tokenizer()
    with pytest.raises(ConfigError, match="assistant"):
        tokenize_conversations(tokenizer, [[{"role": "user", "content": "hi"}]], 100)
    assert encode_prompt(tokenizer, CONVERSATION[:2]) == list(
        tokenizer.apply_chat_template(CONVERSATION[:2], add_generation_prompt=True)["input_ids"]
    )
    assert prompt_messages(CONVERSATION) == CONVERSATION[:2]


def test_reads_sharegpt_messages_prompts_and_text(tmp_path: Path):
    sharegpt = [
        {
            "conversations": [
                {"from": "gpt", "value": "Hi! How can I help?"},  # leading bot turn: dropped
                {"from": "human", "value": "2+2?"},
                {"from": "gpt", "value": "4"},
            ]
        },
        {"conversations": [{"from": "tool", "value": "x"}, {"from": "human", "value": "y"}]},
    ]
    (tmp_path / "a.json").write_text(json.dumps(sharegpt))
    assert load_conversations(tmp_path / "a.json") == [
        [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    ]
    rows = [
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
        {"instruction": "Sum", "input": "1 2", "output": "3", "system": "s"},
        {"prompt": "only a prompt"},
        {"unrelated": 1},
    ]
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert load_conversations(tmp_path / "b.jsonl") == [
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
        [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "Sum\n\n1 2"},
            {"role": "assistant", "content": "3"},
        ],
        [{"role": "user", "content": "only a prompt"}],
    ]
    (tmp_path / "c.txt").write_text("first prompt\n\n second prompt \n")
    assert load_conversations(tmp_path / "c.txt") == [
        [{"role": "user", "content": "first prompt"}],
        [{"role": "user", "content": "second prompt"}],
    ]
    (tmp_path / "bad.json").write_text("[{")
    with pytest.raises(InputError):
        load_conversations(tmp_path / "bad.json")
    with pytest.raises(InputError):
        load_conversations(tmp_path / "missing.json")


def test_held_out_split_is_deterministic_and_disjoint():
    items = list(range(20))
    train, held = split_held_out(items, held_out=5, seed=3)
    assert (train, held) == split_held_out(items, held_out=5, seed=3)
    assert len(held) == 5 and sorted(train + held) == items
    assert train == sorted(train)  # training order is kept
    assert split_held_out(items, held_out=5, seed=4)[1] != held
    assert split_held_out(items[:1], held_out=5, seed=0) == ([0], [])  # never empties training


def test_regenerate_replaces_replies_with_the_targets_greedy_output():
    tokenizer = tiny_tokenizer()
    target = tiny_target(vocab_size=len(tokenizer), num_layers=2)
    conversations = [CONVERSATION, [{"role": "user", "content": "the quick"}]]
    out = regenerate_replies(target, tokenizer, conversations, RegenerateOptions(max_new_tokens=6))
    assert out == regenerate_replies(
        target, tokenizer, conversations, RegenerateOptions(max_new_tokens=6)
    )
    assert [[m["role"] for m in c] for c in out] == [
        ["system", "user", "assistant", "user", "assistant"],
        ["user", "assistant"],
    ]
    prompt = encode_prompt(tokenizer, conversations[1])
    expected = target.generate(
        input_ids=torch.tensor([prompt]),
        max_new_tokens=6,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )[0, len(prompt) :]
    assert out[1][1]["content"] == tokenizer.decode(expected, skip_special_tokens=True)
    assert out[0][2]["content"] != "the fox"  # a random model does not write the data set's reply
    sampling = RegenerateOptions(6, temperature=1.0, seed=5)
    sampled = regenerate_replies(target, tokenizer, conversations, sampling)
    assert sampled == regenerate_replies(target, tokenizer, conversations, sampling)
