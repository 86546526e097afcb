"""Chat fine-tuning (the demo target's last stage): it trains on assistant tokens only and makes
the model's replies more certain."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from models.demo.chat_finetune import (
    FinetuneOptions,
    finetune_on_conversations,
    reply_entropy,
)
from models.training.data import tokenize_conversation
from tests.factories import tiny_target, tiny_tokenizer

CONVERSATIONS = [
    [{"role": "user", "content": f"say {word}"}, {"role": "assistant", "content": f"{word} it is"}]
    for word in ("apple", "river", "stone", "cloud", "green", "seven")
]


def test_finetune_lowers_loss_and_reply_entropy() -> None:
    tokenizer = tiny_tokenizer()
    model = tiny_target("llama", vocab_size=len(tokenizer), num_layers=2)
    before = reply_entropy(model, tokenizer, CONVERSATIONS)
    options = FinetuneOptions(epochs=40, lr=3e-3, batch_size=3, warmup_steps=2)
    result = finetune_on_conversations(model, tokenizer, CONVERSATIONS, options)
    after = reply_entropy(model, tokenizer, CONVERSATIONS)
    assert result.steps == 80
    assert result.last_loss < 0.5 * result.first_loss
    assert after < 0.5 * before, (before, after)
    assert not model.training  # left ready for inference


def test_loss_is_the_cross_entropy_of_reply_tokens_only() -> None:
    tokenizer = tiny_tokenizer()
    model = tiny_target("llama", vocab_size=len(tokenizer), num_layers=2, seed=5)
    conversation = [
        {"role": "user", "content": "a long question with many words in it"},
        {"role": "assistant", "content": "short"},
    ]
    example = tokenize_conversation(tokenizer, conversation, 384)
    ids = torch.tensor(example.input_ids)
    with torch.no_grad():
        logits = model(ids[None]).logits[0, :-1]
    mask = torch.tensor(example.loss_mask[1:], dtype=torch.bool)
    expected = float(F.cross_entropy(logits[mask], ids[1:][mask]))
    everything = float(F.cross_entropy(logits, ids[1:]))
    options = FinetuneOptions(epochs=1, lr=0.0, batch_size=1, warmup_steps=1)
    result = finetune_on_conversations(model, tokenizer, [conversation], options)
    assert abs(result.first_loss - expected) < 1e-4
    assert abs(everything - expected) > 1e-3  # the prompt tokens would have changed the loss
