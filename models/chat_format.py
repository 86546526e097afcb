"""Conversations as the target reads them: chat messages, the tokenizer's chat template, plain
completion for base models, and the ids that end a reply.

Serving encodes prompts here and training renders its examples here, so a head is trained on
exactly the token ids it later drafts after.

    ids = encode_prompt(tokenizer, [{"role": "user", "content": "Hi"}])
"""

from __future__ import annotations

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": str}
Conversation = list[Message]


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render_chat(tokenizer, messages: Conversation, generation_prompt: bool) -> str:
    """The messages through the tokenizer's chat template, as text ("" for no messages)."""
    if not messages:
        return ""
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt
    )


def encode_rendered(tokenizer, text: str) -> list[int]:
    """Token ids of rendered text; the template already wrote the special tokens it wants."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_prompt(tokenizer, messages: Conversation) -> list[int]:
    """Token ids asking the target for the next assistant reply after ``messages``."""
    if has_chat_template(tokenizer):
        return encode_rendered(tokenizer, render_chat(tokenizer, messages, generation_prompt=True))
    return plain_completion_ids(tokenizer, messages)


def plain_text_ids(tokenizer, text: str) -> list[int]:
    """Plain text to continue, tokenised WITH the tokenizer's special tokens (a base model such
    as Gemma needs its BOS)."""
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


def plain_completion_ids(tokenizer, messages: Conversation) -> list[int]:
    """The messages as plain text to continue (see :func:`plain_pieces`)."""
    return plain_text_ids(tokenizer, "".join(text for text, _ in plain_pieces(messages)))


def plain_pieces(messages: Conversation) -> list[tuple[str, bool]]:
    """Plain completion, the format of base models (no chat template): the texts in order, a
    reply continuing its prompt directly and a new prompt after a reply on a new line; system
    turns are left out. Pairs of (text, is_assistant)."""
    pieces: list[tuple[str, bool]] = []
    for message in messages:
        if message["role"] == "system":
            continue
        is_assistant = message["role"] == "assistant"
        text = message["content"]
        if pieces and not is_assistant and pieces[-1][1]:
            text = "\n" + text
        pieces.append((text, is_assistant))
    return pieces


def text_chunks(text: str, max_chars: int) -> list[str]:
    """Consecutive lines packed up to ``max_chars``; an overlong line is cut after a sentence.
    Passages of plain text for a base model to continue (bench prompts, training documents)."""
    out, current = [], ""
    for line in text.split("\n"):
        if len(line) > max_chars and current:
            out.append(current.strip())
            current = ""
        while len(line) > max_chars:
            cut = line.rfind(". ", 0, max_chars) + 1 or max_chars
            out.append(line[:cut].strip())
            line = line[cut:]
        if current and len(current) + len(line) + 1 > max_chars:
            out.append(current.strip())
            current = ""
        current = f"{current}\n{line}" if current else line
    out.append(current.strip())
    return [chunk for chunk in out if len(chunk) >= 20]


def eos_token_ids(model, tokenizer) -> list[int]:
    """End-of-reply ids: the generation config's (may be several) plus the tokenizer's."""
    ids = []
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (configured, getattr(tokenizer, "eos_token_id", None)):
        for item in value if isinstance(value, list) else [value]:
            if item is not None and item not in ids:
                ids.append(int(item))
    return ids
