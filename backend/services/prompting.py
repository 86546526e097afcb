"""Prompt text -> token ids in the conversation format the pair was trained with, and the stops
(EOS ids, turn markers, stop strings) that end a reply in that format.

Formats (``PromptFormat``):
- ``chat_template``: the tokenizer's own chat template;
- ``vicuna_v1.1``: the Vicuna v1.1 conversation (a system line, then ``USER: ... ASSISTANT:``
  turns, replies closed by the EOS token), for Vicuna v1.3 targets, which have no template;
- ``plain``: plain completion for base models;
- ``auto``: the chat template when the tokenizer has one, else plain completion.
The catalog names the format of pairs whose target has no template (``assets/catalog.json``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import get_args

from backend.config import PromptFormat
from backend.engine.stopping import StopSpec
from backend.errors import ConfigError, InputError
from models.chat_format import (
    Message,
    encode_prompt,
    eos_token_ids,
    has_chat_template,
    plain_completion_ids,
    plain_text_ids,
)

logger = logging.getLogger(__name__)

PROMPT_FORMATS: tuple[str, ...] = get_args(PromptFormat)
FORMAT_LABELS = {
    "chat_template": "chat template",
    "vicuna_v1.1": "Vicuna v1.1 (USER: / ASSISTANT: turns)",
    "plain": "plain completion",
}
VICUNA_SYSTEM = (
    "A chat between a curious user and an artificial intelligence assistant. The assistant "
    "gives helpful, detailed, and polite answers to the user's questions."
)
_VICUNA_ROLES = {"user": "USER", "assistant": "ASSISTANT"}
# Stand-ins rendered through a chat template to find what it puts around message contents.
_PLACEHOLDERS = ("EAGLECHATPLACEHOLDERONE", "EAGLECHATPLACEHOLDERTWO", "EAGLECHATPLACEHOLDERTHREE")


def build_messages(history: Sequence[Message], system_prompt: str | None = None) -> list[Message]:
    messages = [dict(m) for m in history]
    if system_prompt and not (messages and messages[0]["role"] == "system"):
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def resolve_format(tokenizer, requested: str = "auto") -> str:
    """The concrete format: a named one as is, ``auto`` from the tokenizer."""
    if requested not in PROMPT_FORMATS:
        raise ConfigError(
            f"unknown prompt format {requested!r}", hint=f"choose from {', '.join(PROMPT_FORMATS)}"
        )
    if requested != "auto":
        return requested
    return "chat_template" if has_chat_template(tokenizer) else "plain"


def prompt_ids(
    tokenizer, messages: Sequence[Message], raw: bool = False, prompt_format: str = "auto"
) -> list[int]:
    """Token ids for a generation that answers the last user message.

    ``raw`` (or the plain format) is plain completion: the message texts, with the tokenizer's
    special tokens (a base model's BOS), continued as they are.
    """
    if not messages or not any(
        m.get("content", "").strip() for m in messages if m["role"] == "user"
    ):
        raise InputError("the prompt is empty", hint="type a message first")
    chosen = "plain" if raw else resolve_format(tokenizer, prompt_format)
    if chosen == "chat_template" and not has_chat_template(tokenizer):
        chosen = "plain"
    if chosen == "plain":
        return plain_completion_ids(tokenizer, list(messages))
    if chosen == "vicuna_v1.1":
        return plain_text_ids(tokenizer, vicuna_prompt(messages))
    return encode_prompt(tokenizer, list(messages))  # the same encoding the heads trained on


def vicuna_prompt(messages: Sequence[Message]) -> str:
    """Vicuna v1.1: ``SYSTEM USER: u ASSISTANT: a</s>USER: u2 ASSISTANT:`` (turns joined by a
    space after a user message and by the EOS text after a reply), ending with the open
    assistant turn."""
    system = next((m["content"] for m in messages if m["role"] == "system"), VICUNA_SYSTEM)
    text = system + " "
    for message in messages:
        role = _VICUNA_ROLES.get(message["role"])
        if role is None:
            continue
        separator = " " if role == "USER" else "</s>"
        text += f"{role}: {message['content']}{separator}"
    return text + "ASSISTANT:"


def format_label(prompt_format: str) -> str:
    """Words for the UI and the CLI."""
    return FORMAT_LABELS.get(prompt_format, prompt_format)


def stop_spec(model, tokenizer, prompt_format: str) -> StopSpec:
    """EOS ids of the tokenizer and the generation config (one id or a list), plus the turn
    markers and stop strings of the chat template when the format is one."""
    eos = frozenset(eos_token_ids(model, tokenizer))
    if prompt_format != "chat_template" or not has_chat_template(tokenizer):
        return StopSpec(eos_ids=eos)
    markers, strings = template_stops(tokenizer)
    markers = {token: text for token, text in markers.items() if token not in eos}
    spec = StopSpec(eos_ids=eos, marker_ids=markers, strings=strings)
    logger.info("reply stops: EOS ids %s, markers and strings %s", sorted(eos), spec.describe())
    return spec


def template_stops(tokenizer) -> tuple[dict[int, str], tuple[str, ...]]:
    """What the chat template writes between turns, from a rendered sample conversation.

    Markers: the special token that closes a reply, and the special tokens that open a user or
    system turn, less those of the assistant's own turn header (a model may write those inside
    its reply). Strings: the plain text that closes a reply before any special token."""
    first, second, third = _PLACEHOLDERS
    conversation = [
        {"role": "user", "content": first},
        {"role": "assistant", "content": second},
        {"role": "user", "content": third},
    ]
    rendered = _render_sample(tokenizer, [{"role": "system", "content": "S"}, *conversation])
    rendered = rendered or _render_sample(tokenizer, conversation)  # templates without system
    segments = re.split("|".join(_PLACEHOLDERS), rendered)
    if len(segments) != 4:  # no template, or one that drops or repeats contents
        return {}, ()
    opening, assistant_header, after_reply, _ = segments
    special = _special_tokens(tokenizer)

    def specials(text: str) -> list[int]:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        return [int(token) for token in ids if token in special]

    own = set(specials(assistant_header))
    closing = specials(after_reply)[:1]
    chosen = [t for t in specials(opening) + specials(after_reply) if t not in own] + closing
    cut = min([after_reply.find(t) for t in special.values() if t in after_reply] or [None])
    text = (after_reply if cut is None else after_reply[:cut]).strip()
    return {token: special[token] for token in chosen}, ((text,) if text else ())


def _render_sample(tokenizer, conversation: list[Message]) -> str:
    try:
        return tokenizer.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=True
        )
    except Exception as err:  # templates raise their own errors (e.g. strict role orders)
        logger.info("chat template cannot render a sample conversation: %s", err)
        return ""


def _special_tokens(tokenizer) -> dict[int, str]:
    """Special tokens by id: the named ones and every added token flagged special."""
    special = dict(zip(tokenizer.all_special_ids, tokenizer.all_special_tokens))
    for token_id, added in getattr(tokenizer, "added_tokens_decoder", {}).items():
        if getattr(added, "special", False):
            special[int(token_id)] = added.content
    return special
