"""Chat fine-tuning of a small target on whole conversations, loss on assistant tokens only.

make-demo uses it to finish the demo target: a model that small, briefly pretrained, spreads
its replies over many tokens (a high entropy per token; "The demo pair" in docs/models.md
has the numbers), so sampled replies are noise. Fine-tuning it on its own greedy replies to a
few thousand prompts (self-distillation) makes its reply distribution peaked the way a real
chat model's is, which keeps temperature-1 replies readable. The greedy text barely changes;
the draft heads are trained after this step, on the fine-tuned model.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from models.training.data import Conversation, pad_examples, tokenize_conversations
from models.training.trainer import warmup_cosine

logger = logging.getLogger(__name__)

MIN_LR_RATIO = 0.1  # the cosine ends at a tenth of the peak learning rate


@dataclass(frozen=True, slots=True)
class FinetuneOptions:
    epochs: int = 3
    lr: float = 3e-4
    batch_size: int = 16
    max_length: int = 384
    warmup_steps: int = 20
    seed: int = 0


@dataclass(frozen=True, slots=True)
class FinetuneResult:
    steps: int
    first_loss: float  # mean assistant-token loss of the first 10 steps
    last_loss: float  # and of the last 10


def finetune_on_conversations(
    model,
    tokenizer,
    conversations: Sequence[Conversation],
    options: FinetuneOptions,
    progress: Callable[[int, int, float], None] | None = None,
) -> FinetuneResult:
    """Train ``model`` in place (float32) on the conversations' assistant tokens."""
    examples = tokenize_conversations(tokenizer, conversations, options.max_length)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    device = model.get_input_embeddings().weight.device
    order = list(range(len(examples)))
    steps_per_epoch = math.ceil(len(order) / options.batch_size)
    total = steps_per_epoch * options.epochs
    optimizer = torch.optim.AdamW(model.parameters(), lr=options.lr, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, warmup_cosine(total, options.warmup_steps, MIN_LR_RATIO)
    )
    rng = random.Random(options.seed)
    losses: list[float] = []
    model.train()
    step = 0
    for _epoch in range(options.epochs):
        rng.shuffle(order)
        for start in range(0, len(order), options.batch_size):
            batch = [examples[i] for i in order[start : start + options.batch_size]]
            ids, mask, valid = pad_examples(batch, pad_id, options.max_length, device)
            logits = model(input_ids=ids, attention_mask=valid).logits[:, :-1].float()
            labels = ids[:, 1:].masked_fill(~mask[:, 1:], -100)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            losses.append(float(loss.detach()))
            step += 1
            if progress is not None:
                progress(step, total, losses[-1])
    model.eval()
    head, tail = losses[:10], losses[-10:]
    return FinetuneResult(step, sum(head) / len(head), sum(tail) / len(tail))


@torch.inference_mode()
def reply_entropy(
    model,
    tokenizer,
    conversations: Sequence[Conversation],
    temperature: float = 1.0,
    max_length: int = 384,
) -> float:
    """Mean entropy (nats) of the model's next-token distribution over assistant tokens."""
    examples = tokenize_conversations(tokenizer, conversations, max_length)
    device = model.get_input_embeddings().weight.device
    total, count = 0.0, 0
    for example in examples:
        ids = torch.tensor(example.input_ids, device=device)[None]
        logits = model(input_ids=ids).logits[0, :-1].float() / temperature
        mask = torch.tensor(example.loss_mask[1:], dtype=torch.bool, device=device)
        log_probs = torch.log_softmax(logits[mask], dim=-1)
        total += float(-(log_probs.exp() * log_probs).sum())
        count += int(mask.sum())
    return total / max(count, 1)
