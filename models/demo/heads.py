"""Training data for the demo pair's draft heads: prompts from the same permissive offline
sources as the demo target, answered by the demo target itself (greedy, batched), so the heads
learn exactly the distribution they will be asked to predict.

    python launch.py make-demo      # target (if missing) + this data + both heads (build.py)
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from models.demo.corpus import collect_corpus

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplyOptions:
    max_new_tokens: int
    batch_size: int = 32  # prompts generated together (left-padded)
    temperature: float = 0.0  # 0 = greedy


def demo_prompts(data_dir: Path, count: int, seed: int = 0) -> list[list[dict[str, str]]]:
    """First user turns (with their system prompt, if any) of the corpus' chat documents."""
    corpus = collect_corpus(data_dir, seed=seed)
    prompts = []
    for document in corpus.train:
        if not document.messages:
            continue
        head = []
        for message in document.messages:
            head.append(message)
            if message["role"] == "user":
                break
        if head and head[-1]["role"] == "user" and len(head[-1]["content"]) < 600:
            prompts.append(head)
    random.Random(seed).shuffle(prompts)
    unique, seen = [], set()
    for prompt in prompts:
        key = prompt[-1]["content"]
        if key not in seen:
            seen.add(key)
            unique.append(prompt)
    return unique[:count]


@torch.inference_mode()
def answer_prompts(
    model,
    tokenizer,
    prompts: list[list[dict[str, str]]],
    options: ReplyOptions,
    progress: Callable[[int, int], None] | None = None,
) -> list[list[dict[str, str]]]:
    """Replies of ``model`` to each prompt (greedy, or sampled at ``options.temperature``),
    generated in left-padded batches of prompts of similar length."""
    tokenizer.padding_side = "left"
    order = sorted(range(len(prompts)), key=lambda i: len(str(prompts[i])))  # similar lengths
    replies: dict[int, str] = {}
    for start in range(0, len(order), options.batch_size):
        chunk = order[start : start + options.batch_size]
        texts = [
            tokenizer.apply_chat_template(prompts[i], add_generation_prompt=True, tokenize=False)
            for i in chunk
        ]
        for index, reply in zip(chunk, _generate_batch(model, tokenizer, texts, options)):
            replies[index] = reply
        if progress is not None:
            progress(min(start + options.batch_size, len(order)), len(order))
    return [
        [*prompt, {"role": "assistant", "content": replies[index]}]
        for index, prompt in enumerate(prompts)
        if replies.get(index)
    ]


def _generate_batch(model, tokenizer, texts: list[str], options: ReplyOptions) -> list[str]:
    """The decoded replies to one left-padded batch of rendered prompts."""
    device = model.get_input_embeddings().weight.device
    pad_id = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )
    sampling = {"do_sample": options.temperature > 0}
    if options.temperature > 0:
        sampling["temperature"] = options.temperature
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    batch = {k: v.to(device) for k, v in batch.items()}
    output = model.generate(
        **batch,
        max_new_tokens=options.max_new_tokens,
        pad_token_id=pad_id,
        eos_token_id=model.generation_config.eos_token_id,
        **sampling,
    )
    new = output[:, batch["input_ids"].shape[1] :]
    return [tokenizer.decode(row, skip_special_tokens=True).strip() for row in new.tolist()]


def write_sharegpt(conversations: list[list[dict[str, str]]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        for number, messages in enumerate(conversations):
            handle.write(json.dumps({"id": f"demo-{number}", "messages": messages}) + "\n")
    logger.info("wrote %d conversations to %s", len(conversations), path)
    return path
