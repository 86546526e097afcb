"""Training data for draft heads: chat files -> token ids with an assistant-only loss mask.

    conversations = load_conversations("sharegpt.json")
    train, held_out = split_held_out(conversations, held_out=8, seed=0)
    train = regenerate_replies(target, tokenizer, train, RegenerateOptions())   # optional
    examples = tokenize_conversations(tokenizer, train, max_length=2048)

A head only ever drafts inside assistant replies, so only assistant tokens carry loss. The mask is
computed by rendering growing prefixes of the conversation through the tokenizer's own chat
template: the characters an assistant turn adds are exactly its span, whatever the template.
Regenerating the replies with the target teaches the head the target's own distribution
(EAGLE-3 practice) rather than whatever model wrote the data set.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from jinja2 import TemplateError

from models.chat_format import (
    Conversation,
    encode_prompt,
    encode_rendered,
    eos_token_ids,
    has_chat_template,
    plain_pieces,
    render_chat,
    text_chunks,
)
from models.errors import ConfigError, InputError

logger = logging.getLogger(__name__)

T = TypeVar("T")

_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "model": "assistant",
    "system": "system",
}
_PROMPT_KEYS = ("prompt", "instruction", "text", "question")
_REPLY_KEYS = ("output", "response", "completion", "answer")


@dataclass(frozen=True, slots=True)
class TokenizedExample:
    input_ids: list[int]  # [S] target token ids
    loss_mask: list[int]  # [S] 1 where the token belongs to an assistant reply


# ---- reading ---------------------------------------------------------------------------------


def load_conversations(path: str | Path) -> list[Conversation]:
    """Read ShareGPT JSON/JSONL (``conversations``/``messages``), prompt JSONL or a .txt file of
    one prompt per line. Records that cannot be read are skipped with one warning."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"training data file {path} does not exist")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".txt":
        return [
            [{"role": "user", "content": line.strip()}]
            for line in text.splitlines()
            if line.strip()
        ]
    records = _json_records(text, path)
    conversations, skipped = [], 0
    for record in records:
        conversation = record_to_conversation(record)
        if conversation:
            conversations.append(conversation)
        else:
            skipped += 1
    if skipped:
        logger.warning(
            "skipped %d of %d records in %s (no usable turns)", skipped, len(records), path
        )
    if not conversations:
        raise InputError(
            f"no conversations or prompts found in {path}",
            hint="expected ShareGPT 'conversations'/'messages' records or 'prompt' fields",
        )
    return conversations


_TEXT_KEYS = ("text", "body", "content", "story")


def load_documents(
    path: str | Path, max_chars: int, held_out_share: float = 0.0
) -> list[Conversation]:
    """Plain text for base-model heads: each document becomes one reply-only conversation (every
    token is trained, plain completion), cut at line or sentence ends into pieces of at most
    ``max_chars``. Reads .txt (lines), JSON/JSONL records with a text field, and chat records
    (their turns joined). The held-out units (:func:`held_out_units`) are left out."""
    units, plain = document_units(path)
    kept = [u for u in units if not is_held_out(u, held_out_share)]
    texts = ["\n".join(kept)] if plain else kept
    pieces = [chunk for text in texts for chunk in text_chunks(text, max_chars)]
    if not pieces:
        raise InputError(f"no text found in {path}")
    return [[{"role": "assistant", "content": piece}] for piece in pieces]


def held_out_units(path: str | Path, share: float) -> list[str]:
    """The units of a text file never trained on: the lines of a .txt file (a Wikipedia
    article, a paragraph) or the records of a JSON file (a web page) whose content hash falls in
    the first ``share`` of the hash range. Chosen by content alone, the split does not depend on
    the other files, their order or the seed, and whoever reads the file finds the same part."""
    return [u for u in document_units(path)[0] if is_held_out(u, share)]


def is_held_out(unit: str, share: float) -> bool:
    if share <= 0 or not unit.strip():
        return False
    digest = hashlib.sha256(unit.strip().encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") < share * 2**64


def document_units(path: str | Path) -> tuple[list[str], bool]:
    """The file's units and whether it is plain text (its units are lines, blank ones kept, to
    be joined again by newlines) rather than records."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"training data file {path} does not exist")
    raw = path.read_text(encoding="utf-8")
    if path.suffix == ".txt":
        return raw.split("\n"), True
    texts = []
    for record in _json_records(raw, path) if raw.lstrip()[:1] in "[{" else []:
        text = next(
            (
                record[k]
                for k in _TEXT_KEYS
                if isinstance(record, dict) and isinstance(record.get(k), str)
            ),
            None,
        )
        if text is None:
            text = "\n".join(m["content"] for m in record_to_conversation(record))
        texts.append(text)
    return texts, False


def _json_records(text: str, path: Path) -> list[Any]:
    stripped = text.lstrip()
    try:
        if stripped.startswith("["):
            return list(json.loads(stripped))
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as err:
        raise InputError(f"{path} is not valid JSON or JSON Lines: {err}") from err


def record_to_conversation(record: Any) -> Conversation:
    """One data record -> a list of role/content messages ([] when nothing usable)."""
    if not isinstance(record, dict):
        return []
    turns = record.get("conversations", record.get("messages"))
    conversation: Conversation = []
    if isinstance(record.get("system"), str) and record["system"].strip():
        conversation.append({"role": "system", "content": record["system"]})
    if isinstance(turns, list):
        for turn in turns:
            if not isinstance(turn, dict):
                return []
            role = _ROLES.get(str(turn.get("from", turn.get("role", ""))).lower())
            content = turn.get("value", turn.get("content"))
            if role is None or not isinstance(content, str):
                return []  # tool calls and unknown roles: skip the whole record
            conversation.append({"role": role, "content": content})
    else:
        prompt = next((record[k] for k in _PROMPT_KEYS if isinstance(record.get(k), str)), None)
        if not prompt:
            return []
        if isinstance(record.get("input"), str) and record["input"].strip():
            prompt = f"{prompt}\n\n{record['input']}"
        conversation.append({"role": "user", "content": prompt})
        reply = next((record[k] for k in _REPLY_KEYS if isinstance(record.get(k), str)), None)
        if reply:
            conversation.append({"role": "assistant", "content": reply})
    while conversation and conversation[0]["role"] == "assistant":
        conversation.pop(0)  # ShareGPT dumps sometimes start with the bot's greeting
    return conversation if any(m["role"] == "user" for m in conversation) else []


def split_held_out(items: Sequence[T], held_out: int, seed: int) -> tuple[list[T], list[T]]:
    """Deterministic split: ``held_out`` items chosen by a seeded shuffle; the rest keep order."""
    held_out = max(0, min(held_out, len(items) - 1))
    chosen = set(random.Random(seed).sample(range(len(items)), held_out))
    train = [item for i, item in enumerate(items) if i not in chosen]
    return train, [items[i] for i in sorted(chosen)]


def batch_indices(num_examples: int, batch_size: int, step: int, seed: int) -> list[int]:
    """Example indices of ``step``: a seeded permutation per epoch, read as one stream."""
    indices = []
    for position in range(step * batch_size, (step + 1) * batch_size):
        epoch, offset = divmod(position, num_examples)
        order = list(range(num_examples))
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
        indices.append(order[offset])
    return indices


# ---- tokenising ------------------------------------------------------------------------------


def prompt_messages(conversation: Conversation) -> Conversation:
    """The conversation up to (not including) its first assistant reply: an evaluation prompt."""
    for index, message in enumerate(conversation):
        if message["role"] == "assistant":
            return conversation[:index]
    return list(conversation)


def tokenize_conversation(
    tokenizer, conversation: Conversation, max_length: int
) -> TokenizedExample:
    """Token ids of the whole conversation and a mask that is 1 only on assistant tokens
    (each reply's text plus the end-of-turn tokens the template puts after it)."""
    if not has_chat_template(tokenizer):
        return _tokenize_plain(tokenizer, plain_pieces(conversation), max_length)
    # Character span of each assistant turn = what rendering it adds to the rendered prefix.
    segments: list[tuple[str, bool]] = []  # (text, is_assistant) in order
    rendered = ""
    for index, message in enumerate(conversation):
        if message["role"] == "assistant":
            before = render_chat(tokenizer, conversation[:index], generation_prompt=True)
            segments.append((before, False))
        after = render_chat(tokenizer, conversation[: index + 1], generation_prompt=False)
        segments.append((after, message["role"] == "assistant"))
    pieces: list[tuple[str, bool]] = []
    for text, is_assistant in segments:
        if not text.startswith(rendered):
            pieces = _last_reply_only(tokenizer, conversation)
            break
        pieces.append((text[len(rendered) :], is_assistant))
        rendered = text
    return _tokenize_pieces(tokenizer, pieces, max_length)


def _last_reply_only(tokenizer, conversation: Conversation) -> list[tuple[str, bool]]:
    """Templates that rewrite earlier turns (e.g. drop old reasoning) break the prefix property:
    train on the final reply only, in the form the target sees when writing it."""
    replies = [i for i, m in enumerate(conversation) if m["role"] == "assistant"]
    if not replies:
        return [(render_chat(tokenizer, conversation, generation_prompt=False), False)]
    last = replies[-1]
    before = render_chat(tokenizer, conversation[:last], generation_prompt=True)
    after = render_chat(tokenizer, conversation[: last + 1], generation_prompt=False)
    if not after.startswith(before):
        logger.warning("chat template output is not prefix-stable; conversation skipped")
        return [(after, False)]
    return [(before, False), (after[len(before) :], True)]


def _tokenize_pieces(
    tokenizer, pieces: list[tuple[str, bool]], max_length: int
) -> TokenizedExample:
    """Tokenise the joined text once (so merges across turn boundaries match inference) and
    mark tokens by where they start; without offsets, tokenise piece by piece."""
    text = "".join(p for p, _ in pieces)
    if getattr(tokenizer, "is_fast", False):
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        bounds, position = [], 0
        for piece, is_assistant in pieces:
            bounds.append((position, position + len(piece), is_assistant))
            position += len(piece)
        ids, mask = list(encoded["input_ids"]), []
        for start, _end in encoded["offset_mapping"]:
            mask.append(int(any(a <= start < b and flag for a, b, flag in bounds)))
    else:
        ids, mask = [], []
        for piece, is_assistant in pieces:
            piece_ids = encode_rendered(tokenizer, piece)
            ids += piece_ids
            mask += [int(is_assistant)] * len(piece_ids)
    return TokenizedExample(ids[:max_length], mask[:max_length])


def _tokenize_plain(
    tokenizer, pieces: list[tuple[str, bool]], max_length: int | None
) -> TokenizedExample:
    """Plain completion: the joined text tokenised once WITH the tokenizer's special tokens (a
    base model such as Gemma needs its BOS), which never carry loss."""
    text = "".join(p for p, _ in pieces)
    encoded = tokenizer(
        text,
        add_special_tokens=True,
        return_special_tokens_mask=True,
        return_offsets_mapping=bool(getattr(tokenizer, "is_fast", False)),
    )
    ids = list(encoded["input_ids"])
    special = list(encoded["special_tokens_mask"])
    if "offset_mapping" in encoded:
        bounds, position = [], 0
        for piece, is_assistant in pieces:
            bounds.append((position, position + len(piece), is_assistant))
            position += len(piece)
        starts = [start for start, _ in encoded["offset_mapping"]]
        mask = [
            int(not sp and any(a <= start < b and flag for a, b, flag in bounds))
            for start, sp in zip(starts, special)
        ]
    else:  # slow tokenizers: the mask follows the pieces' own token counts
        mask = [0] * (len(ids) - sum(len(encode_rendered(tokenizer, p)) for p, _ in pieces))
        for piece, is_assistant in pieces:
            mask += [int(is_assistant)] * len(encode_rendered(tokenizer, piece))
        mask = (mask + [0] * len(ids))[: len(ids)]
    end = len(ids) if max_length is None else max_length
    return TokenizedExample(ids[:end], mask[:end])


def tokenize_conversations(
    tokenizer, conversations: Sequence[Conversation], max_length: int
) -> list[TokenizedExample]:
    """Tokenise all; conversations without any assistant token (after truncation) are dropped."""
    examples, dropped = [], 0
    for conversation in conversations:
        try:
            example = tokenize_conversation(tokenizer, conversation, max_length)
        except TemplateError as err:  # e.g. a template that rejects system turns
            logger.debug("chat template rejected a conversation: %s", err)
            dropped += 1
            continue
        if sum(example.loss_mask) >= 1:
            examples.append(example)
        else:
            dropped += 1
    if dropped:
        logger.warning(
            "dropped %d conversations (no assistant token, or the template refused them)", dropped
        )
    if not examples:
        raise ConfigError(
            "no training example has an assistant reply",
            hint="the data holds prompts only: regenerate the replies with the target (--regenerate)",
        )
    return examples


def pad_examples(
    examples: Sequence[TokenizedExample], pad_id: int, max_length: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad a batch: token ids [B, S], assistant mask [B, S] bool (False on padding) and
    the attention mask [B, S] (1 on real tokens), truncated to ``max_length``."""
    length = min(max(len(e.input_ids) for e in examples), max_length)
    ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), length), dtype=torch.bool)
    valid = torch.zeros((len(examples), length), dtype=torch.long)
    for row, example in enumerate(examples):
        n = min(len(example.input_ids), length)
        ids[row, :n] = torch.tensor(example.input_ids[:n])
        mask[row, :n] = torch.tensor(example.loss_mask[:n], dtype=torch.bool)
        valid[row, :n] = 1
    return ids.to(device), mask.to(device), valid.to(device)


# ---- regeneration ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RegenerateOptions:
    max_new_tokens: int = 256  # per reply
    temperature: float = 0.0  # 0 = greedy
    max_length: int = 2048  # prompt + reply tokens; later turns that do not fit are dropped
    seed: int = 0  # of the sampling (the caller's RNG is left as it was)


@torch.no_grad()
def regenerate_replies(
    model,
    tokenizer,
    conversations: Sequence[Conversation],
    options: RegenerateOptions = RegenerateOptions(),
    progress: Callable[[int, int], None] | None = None,
) -> list[Conversation]:
    """Replace every assistant reply by the target's own (batch 1): after each user turn the
    target answers the conversation so far. Greedy when the temperature is 0."""
    device = model.get_input_embeddings().weight.device
    eos_ids = eos_token_ids(model, tokenizer)
    out: list[Conversation] = []
    cuda = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):  # seeded sampling; the caller's RNG is kept
        torch.manual_seed(options.seed)
        for number, conversation in enumerate(conversations, start=1):
            regenerated: Conversation = []
            for message in conversation:
                if message["role"] == "assistant":
                    continue
                regenerated.append(message)
                if message["role"] != "user":
                    continue
                prompt = encode_prompt(tokenizer, regenerated)
                budget = min(options.max_new_tokens, options.max_length - len(prompt))
                if budget < 1:
                    regenerated.pop()
                    break
                reply = _generate(model, tokenizer, prompt, budget, options.temperature, eos_ids)
                regenerated.append({"role": "assistant", "content": reply})
            if any(m["role"] == "assistant" for m in regenerated):
                out.append(regenerated)
            if progress is not None:
                progress(number, len(conversations))
    logger.info("regenerated replies for %d of %d conversations", len(out), len(conversations))
    return out


def _generate(
    model, tokenizer, prompt: list[int], budget: int, temperature: float, eos_ids: list[int]
) -> str:
    device = model.get_input_embeddings().weight.device
    input_ids = torch.tensor([prompt], dtype=torch.long, device=device)
    sampling = {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0}
    output = model.generate(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=budget,
        eos_token_id=eos_ids or None,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0],
        **(sampling if temperature > 0 else {"do_sample": False}),
    )
    new_ids = output[0, len(prompt) :].tolist()
    return tokenizer.decode(new_ids, skip_special_tokens=True)
