"""Prompt text -> token ids, through the tokenizer's chat template when it has one."""

from __future__ import annotations

from collections.abc import Sequence

from backend.errors import InputError
from models.training.data import encode_prompt, has_chat_template, plain_completion_ids

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": str}


def build_messages(history: Sequence[Message], system_prompt: str | None = None) -> list[Message]:
    messages = [dict(m) for m in history]
    if system_prompt and not (messages and messages[0]["role"] == "system"):
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def prompt_ids(tokenizer, messages: Sequence[Message], raw: bool = False) -> list[int]:
    """Token ids for a generation that answers the last user message.

    ``raw`` (or a tokenizer without a chat template) is plain completion: the message texts,
    with the tokenizer's special tokens (a base model's BOS), continued as they are.
    """
    if not messages or not any(
        m.get("content", "").strip() for m in messages if m["role"] == "user"
    ):
        raise InputError("the prompt is empty", hint="type a message first")
    if raw or not has_chat_template(tokenizer):
        return plain_completion_ids(tokenizer, list(messages))
    return encode_prompt(tokenizer, list(messages))  # the same encoding the heads trained on
