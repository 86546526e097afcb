"""The demo target's tokenizer: a byte-level BPE with six special tokens and a chat template,
and the rendering of corpus documents into the packed token streams the model trains on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from models.demo.corpus import Document

PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|eos|>"
SYSTEM, USER, ASSISTANT = "<|system|>", "<|user|>", "<|assistant|>"
SPECIAL_TOKENS = [PAD, BOS, EOS, SYSTEM, USER, ASSISTANT]  # ids 0..5 in this order
ROLES = ("system", "user", "assistant")

# One turn is "<|role|>content<|eos|>"; the prompt for a reply ends with "<|assistant|>" and the
# model ends its reply with <|eos|> (the generation_config's eos_token_id).
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{- raise_exception('role must be system, user or assistant, got ' + message['role']) }}"
    "{%- endif %}"
    "{{- '<|' + message['role'] + '|>' + (message['content'] | trim) + eos_token }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>' }}{%- endif %}"
)
CHAT_FORMAT = "<|bos|>[<|system|>...<|eos|>]<|user|>...<|eos|><|assistant|>...<|eos|>"


def train_tokenizer(
    texts: Iterator[str] | list[str], vocab_size: int, out_dir: Path, max_length: int
) -> Any:
    """Train a byte-level BPE (digits split one by one) and save it as a transformers tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        extra_special_tokens=[SYSTEM, USER, ASSISTANT],
        chat_template=CHAT_TEMPLATE,
        model_max_length=max_length,
        padding_side="left",
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    hf_tok.save_pretrained(str(out_dir))
    return hf_tok


def load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def render(doc: Document, tokenizer: Any) -> str:
    """A document as the exact text the model is trained on (special tokens included)."""
    if doc.messages is not None:
        return tokenizer.apply_chat_template(doc.messages, tokenize=False)
    return f"{BOS}{doc.text}{EOS}"


def tokenize_docs(docs: list[Document], tokenizer: Any, batch: int = 512) -> np.ndarray:
    """Concatenate the rendered documents into one uint16 token stream."""
    parts: list[np.ndarray] = []
    backend = tokenizer.backend_tokenizer
    for i in range(0, len(docs), batch):
        texts = [render(d, tokenizer) for d in docs[i : i + batch]]
        for enc in backend.encode_batch(texts, add_special_tokens=False):
            parts.append(np.asarray(enc.ids, dtype=np.uint16))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)


def sample_texts(docs: list[Document], budget: int) -> Iterator[str]:
    """Texts for learning the BPE merges: the documents in order, each repeated training copy
    once, until ``budget`` characters have been given."""
    seen: set[int] = set()
    for d in docs:
        if id(d) in seen:
            continue
        seen.add(id(d))
        text = d.plain_text()
        budget -= len(text)
        yield text
        if budget <= 0:
            return
