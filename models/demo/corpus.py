"""Reproducible build of the bundled demo TARGET model: a byte-level BPE tokenizer with a chat
template and a small ``LlamaForCausalLM`` chat model trained from scratch on permissively licensed
offline text (``../shared/data``), exported to ``assets/demo/target/``.

Typical use (one CPU thread, 70-minute training budget, resumable, exports at the end)::

    python -m models.training.demo_target --minutes 70
    # interrupted? the same command resumes from work/demo-build/ckpt/last.pt
    python -m models.training.demo_target --export-only      # export the last checkpoint now
    python -m models.training.demo_target --fresh --minutes 70   # rebuild tokenizer/data, restart

Pipeline: ``collect_corpus`` (documents + held-out slice) -> ``train_tokenizer`` ->
``tokenize_corpus`` (packed uint16 token streams in the work folder) -> ``build_config`` ->
``train`` (AdamW, warm-up + cosine, packed windows, grad clipping, periodic checkpoints with
model + optimizer + step + data position) -> ``export`` (config, bf16 safetensors, tokenizer,
generation_config, manifest.json).

The schedule follows ``--steps`` when given (exactly reproducible), otherwise the time budget
``--minutes``: the cosine is driven by the fraction of the budget spent, so the learning rate is
annealed when the budget ends whatever the machine's speed; the step count reached is recorded.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import logging
import math
import os
import random
import re
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DATA_DIR = REPO_ROOT.parent / "shared" / "data"
DEFAULT_BENCH_DIR = REPO_ROOT.parent / "shared" / "bench"
DEFAULT_WORK_DIR = REPO_ROOT / "work" / "demo-build"
DEFAULT_OUT_DIR = REPO_ROOT / "assets" / "demo" / "target"

ASSISTANT_NAME = "EagleChat demo"
AUTHOR_NAME = "the EagleChat team"

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

SYSTEM_PROMPTS = [
    f"You are {ASSISTANT_NAME}, a small helpful assistant.",
    "You are a helpful assistant.",
    "You are a friendly assistant. Answer clearly and briefly.",
    f"You are {ASSISTANT_NAME}, made by {AUTHOR_NAME}. Be helpful and honest.",
]
SYSTEM_PROMPT_FRACTION = 0.15  # share of chat documents that get a system turn


# --------------------------------------------------------------------------------------------
# Corpus


@dataclass
class Document:
    """One training document: a conversation (``messages``) or plain ``text``."""

    source: str
    messages: list[dict[str, str]] | None = None
    text: str | None = None

    def plain_text(self) -> str:
        if self.messages is not None:
            return "\n".join(m["content"] for m in self.messages)
        return self.text or ""


@dataclass(frozen=True)
class Source:
    """A data set read at run time from the data folder."""

    name: str
    files: str  # path or glob, relative to the data folder
    licence: str
    kind: str  # "chat" or "text"
    loader: Callable[[Path, list[Path]], Iterator[Document]]
    max_docs: int | None = None  # cap after a seeded shuffle
    repeat: int = 1  # copies of each training document (tiny but important sets)
    note: str = ""


_SPECIAL_RE = re.compile(r"<\|(?:pad|bos|eos|system|user|assistant|endoftext)\|>")


def _clean(text: str) -> str:
    """Strip stray special-token strings and surrounding whitespace."""
    return _SPECIAL_RE.sub("", str(text)).strip()


def _conversation(source: str, turns: list[tuple[str, str]]) -> Document | None:
    """Build a chat document from (role, text) pairs, merging consecutive same-role turns.

    Returns None unless there is at least one user turn followed by an assistant turn.
    """
    merged: list[dict[str, str]] = []
    for role, text in turns:
        text = _clean(text)
        if not text:
            continue
        if merged and merged[-1]["role"] == role:
            merged[-1]["content"] += "\n" + text
        else:
            merged.append({"role": role, "content": text})
    while merged and merged[0]["role"] != "user":
        merged.pop(0)
    if len(merged) < 2:
        return None
    return Document(source=source, messages=merged)


def _rename_fastchat(text: str) -> str:
    text = text.replace("Large Model Systems Organization (LMSYS)", AUTHOR_NAME)
    text = text.replace("Large Model Systems Organization", AUTHOR_NAME)
    text = text.replace("LMSYS", AUTHOR_NAME)
    return text.replace("Vicuna", ASSISTANT_NAME)


def load_fastchat(name: str, files: list[Path]) -> Iterator[Document]:
    roles = {"human": "user", "gpt": "assistant"}
    for path in files:
        for rec in json.loads(path.read_text(encoding="utf-8")):
            turns = [
                (roles[t["from"]], _rename_fastchat(t["value"]))
                for t in rec["conversations"]
                if t.get("from") in roles
            ]
            if doc := _conversation(name, turns):
                yield doc


def _instruction_doc(name: str, instruction: str, inp: str, output: str) -> Document | None:
    prompt = instruction.strip()
    if inp and inp.strip():
        prompt = f"{prompt}\n\n{inp.strip()}"
    return _conversation(name, [("user", prompt), ("assistant", output)])


def load_identity(name: str, files: list[Path]) -> Iterator[Document]:
    def fill(s: str) -> str:
        return s.replace("{{name}}", ASSISTANT_NAME).replace("{{author}}", AUTHOR_NAME)

    for path in files:
        for rec in json.loads(path.read_text(encoding="utf-8")):
            doc = _instruction_doc(
                name, fill(rec["instruction"]), fill(rec.get("input", "")), fill(rec["output"])
            )
            if doc:
                yield doc


def load_gpteacher(name: str, files: list[Path]) -> Iterator[Document]:
    for path in files:
        for rec in json.loads(path.read_text(encoding="utf-8")):
            doc = _instruction_doc(
                name, rec["instruction"], rec.get("input", ""), rec.get("response", "")
            )
            if doc:
                yield doc


def load_self_instruct(name: str, files: list[Path]) -> Iterator[Document]:
    for path in files:
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            for inst in rec.get("instances", []):
                doc = _instruction_doc(
                    name, rec["instruction"], inst.get("input", ""), inst.get("output", "")
                )
                if doc:
                    yield doc


_CALC_RE = re.compile(r"<<[^>]*>>")
_FINAL_RE = re.compile(r"\n?#### *(.+)\s*$")


def load_gsm8k(name: str, files: list[Path]) -> Iterator[Document]:
    for path in files:
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            answer = _CALC_RE.sub("", rec["answer"])
            answer = _FINAL_RE.sub(lambda m: f"\nThe answer is {m.group(1).strip()}.", answer)
            if doc := _conversation(name, [("user", rec["question"]), ("assistant", answer)]):
                yield doc


def load_chatterbot(name: str, files: list[Path]) -> Iterator[Document]:
    import yaml  # PyYAML is a transformers dependency

    for path in files:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for conv in data.get("conversations", []) or []:
            if not isinstance(conv, list):
                continue
            turns = [(("user", "assistant")[i % 2], str(u)) for i, u in enumerate(conv)]
            if doc := _conversation(name, turns):
                yield doc


def load_chitchat(name: str, files: list[Path]) -> Iterator[Document]:
    for path in files:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            data = json.load(fh)
        for key in sorted(data):
            turns: list[tuple[str, str]] = []
            first_sender: str | None = None
            for turn in data[key].get("messages", []):
                if not turn:
                    continue
                sender = turn[0].get("sender")
                first_sender = first_sender or sender
                role = "user" if sender == first_sender else "assistant"
                turns.append((role, "\n".join(m.get("text", "") for m in turn)))
            if doc := _conversation(name, turns):
                yield doc


def load_topical_chat(name: str, files: list[Path]) -> Iterator[Document]:
    for path in files:
        data = json.loads(path.read_text(encoding="utf-8"))
        for key in sorted(data):
            turns = [
                ("user" if m.get("agent") == "agent_1" else "assistant", m.get("message", ""))
                for m in data[key].get("content", [])
            ]
            if doc := _conversation(name, turns):
                yield doc


def _paragraphs(text: str) -> list[str]:
    """Split on blank lines and re-flow hard-wrapped lines into single-line paragraphs."""
    paras = []
    for block in re.split(r"\n\s*\n", text):
        lines = [ln.strip() for ln in block.splitlines() if ln.strip()]
        if lines:
            paras.append(" ".join(lines))
    return paras


def load_tinystories(name: str, files: list[Path], chunk_chars: int = 2000) -> Iterator[Document]:
    # Story boundaries are not marked: cut the text into chunks of whole lines.
    for path in files:
        buf: list[str] = []
        size = 0
        for line in path.read_text(encoding="utf-8").splitlines():
            line = _clean(line)
            if not line:
                continue
            buf.append(line)
            size += len(line)
            if size >= chunk_chars:
                yield Document(source=name, text="\n\n".join(buf))
                buf, size = [], 0
        if buf:
            yield Document(source=name, text="\n\n".join(buf))


def load_fairy_tales(name: str, files: list[Path], chunk_chars: int = 6000) -> Iterator[Document]:
    for path in files:
        rec = json.loads(path.read_text(encoding="utf-8"))
        title = str(rec.get("name", "")).split(" - ", 1)[-1].strip()
        paras = [_clean(p) for p in _paragraphs(rec.get("body", ""))]
        buf, size = [title] if title else [], 0
        for p in paras:
            if not p:
                continue
            buf.append(p)
            size += len(p)
            if size >= chunk_chars:
                yield Document(source=name, text="\n\n".join(buf))
                buf, size = [], 0
        if buf:
            yield Document(source=name, text="\n\n".join(buf))


def load_pydoc_topics(name: str, files: list[Path]) -> Iterator[Document]:
    del files  # read from the standard library of the running interpreter
    try:
        from pydoc_data.topics import topics
    except ImportError:  # pragma: no cover - stripped-down Pythons
        logger.warning("pydoc_data.topics is not available: skipping %s", name)
        return
    for key in sorted(topics):
        text = _clean(topics[key])
        if text:
            yield Document(source=name, text=text)


SOURCES: list[Source] = [
    Source(
        "identity",
        "llamafactory/identity.json",
        "Apache-2.0",
        "chat",
        load_identity,
        repeat=8,
        note="{{name}}='EagleChat demo', {{author}}='the EagleChat team'",
    ),
    Source(
        "fastchat_dummy",
        "fastchat/dummy_conversation.json",
        "Apache-2.0",
        "chat",
        load_fastchat,
        note="Vicuna/LMSYS renamed to EagleChat demo/the EagleChat team",
    ),
    Source("chatterbot", "chatterbot-corpus/*.yml", "BSD-3-Clause", "chat", load_chatterbot),
    Source("self_instruct", "self-instruct/*.jsonl", "Apache-2.0", "chat", load_self_instruct),
    Source("gpteacher", "gpteacher/*.json", "MIT", "chat", load_gpteacher),
    Source(
        "gsm8k",
        "gsm8k/train.jsonl",
        "MIT",
        "chat",
        load_gsm8k,
        note="train split; <<calc>> marks removed, '#### N' -> 'The answer is N.'",
    ),
    Source(
        "chitchat",
        "chitchat/dataset.json.gz",
        "MIT",
        "chat",
        load_chitchat,
        max_docs=1500,
        note="human-human chit-chat; first speaker as user",
    ),
    Source(
        "topical_chat",
        "topical-chat/*.json",
        "CDLA-Sharing-1.0",
        "chat",
        load_topical_chat,
        max_docs=1200,
        note="agent_1 as user, agent_2 as assistant",
    ),
    Source(
        "tinystories", "tinystories/tiny_stories.txt", "CDLA-Sharing-1.0", "text", load_tinystories
    ),
    Source(
        "fairy_tales",
        "lcats-fairy-tales/*/*/story.json",
        "public domain (Project Gutenberg)",
        "text",
        load_fairy_tales,
    ),
    Source(
        "python_docs",
        "",
        "PSF-2.0 (CPython pydoc_data.topics)",
        "text",
        load_pydoc_topics,
        note=f"CPython {sys.version_info.major}.{sys.version_info.minor}",
    ),
]
SOURCE_NAMES = [s.name for s in SOURCES]


def _mostly_ascii(text: str, min_ratio: float = 0.95) -> bool:
    """True for (mostly) English text; drops e.g. the Chinese half of identity.json."""
    return bool(text) and sum(c.isascii() for c in text) >= min_ratio * len(text)


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def load_bench_prompts(bench_dir: Path | None) -> set[str]:
    """Normalised benchmark prompts (every turn) so that training never sees them."""
    prompts: set[str] = set()
    if bench_dir is None or not bench_dir.is_dir():
        return prompts
    for path in sorted(bench_dir.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                rec = json.loads(line)
                prompts.update(_norm(t) for t in rec.get("turns", []) if isinstance(t, str))
    return prompts


@dataclass
class Corpus:
    train: list[Document]
    val: list[Document]
    stats: dict[str, dict[str, Any]]


def collect_corpus(
    data_dir: Path,
    sources: list[str] | None = None,
    *,
    val_fraction: float = 0.02,
    seed: int = 0,
    max_docs_per_source: int | None = None,
    bench_dir: Path | None = None,
) -> Corpus:
    """Read the selected sources, drop benchmark prompts, split off a held-out slice.

    Each source is shuffled with a seed derived from ``seed`` and its name, capped, and split
    into train/val before repetition, so held-out documents never appear in training.
    """
    selected = [s for s in SOURCES if sources is None or s.name in sources]
    bench = load_bench_prompts(bench_dir)
    train: list[Document] = []
    val: list[Document] = []
    stats: dict[str, dict[str, Any]] = {}
    for src in selected:
        files = sorted(data_dir.glob(src.files)) if src.files else []
        if src.files and not files:
            logger.warning(
                "source %s: no files match %s in %s, skipped", src.name, src.files, data_dir
            )
            continue
        docs = list(src.loader(src.name, files))
        n_read = len(docs)
        if bench:
            docs = [
                d
                for d in docs
                if not (
                    d.messages
                    and any(
                        m["role"] == "user" and _norm(m["content"]) in bench for m in d.messages
                    )
                )
            ]
        n_bench = n_read - len(docs)
        docs = [d for d in docs if _mostly_ascii(d.plain_text())]
        n_non_english = n_read - n_bench - len(docs)
        rng = random.Random(f"{seed}:{src.name}")
        rng.shuffle(docs)
        cap = min(x for x in (src.max_docs, max_docs_per_source, len(docs)) if x is not None)
        docs = docs[:cap]
        n_val = int(len(docs) * val_fraction) if len(docs) >= 10 else 0
        if val_fraction > 0 and len(docs) >= 10:
            n_val = max(1, n_val)
        src_val, src_train = docs[:n_val], docs[n_val:]
        if src.kind == "chat":
            for d in src_train + src_val:
                if rng.random() < SYSTEM_PROMPT_FRACTION and d.messages:
                    d.messages.insert(0, {"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
        train.extend(src_train * src.repeat)
        val.extend(src_val)
        stats[src.name] = {
            "files": [str(p.relative_to(data_dir)) for p in files]
            if len(files) <= 8
            else f"{src.files} ({len(files)} files)",
            "licence": src.licence,
            "kind": src.kind,
            "docs_read": n_read,
            "dropped_bench_overlap": n_bench,
            "dropped_non_ascii": n_non_english,
            "docs_used": len(docs),
            "train_docs": len(src_train),
            "val_docs": len(src_val),
            "repeat": src.repeat,
            "train_chars": sum(len(d.plain_text()) for d in src_train) * src.repeat,
            "note": src.note,
        }
        logger.info(
            "source %-14s %6d docs read, %6d used (%d held out, x%d), %9d chars",
            src.name,
            n_read,
            len(docs),
            len(src_val),
            src.repeat,
            stats[src.name]["train_chars"],
        )
    if not train:
        raise RuntimeError(f"no training documents found in {data_dir}")
    random.Random(seed).shuffle(train)
    random.Random(f"{seed}:val").shuffle(val)  # so any prefix of the held-out stream is mixed
    return Corpus(train=train, val=val, stats=stats)


# --------------------------------------------------------------------------------------------
# Tokenizer


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


# --------------------------------------------------------------------------------------------
# Model


@dataclass(frozen=True)
class ModelShape:
    hidden: int = 192
    layers: int = 12
    heads: int = 3
    kv_heads: int = 1
    intermediate: int = 512
    max_positions: int = 1024
    rope_theta: float = 10000.0


def build_config(shape: ModelShape, tokenizer: Any) -> Any:
    """A stock LlamaConfig (tied embeddings, sdpa attention) for the tokenizer's vocabulary."""
    from transformers import LlamaConfig

    if shape.hidden % shape.heads or shape.heads % shape.kv_heads:
        raise ValueError(
            f"hidden {shape.hidden} / heads {shape.heads} / kv {shape.kv_heads} must divide evenly"
        )
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.hidden // shape.heads,
        intermediate_size=shape.intermediate,
        max_position_embeddings=shape.max_positions,
        rope_theta=shape.rope_theta,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        attn_implementation="sdpa",
    )
    return config


def build_model(config: Any, seed: int) -> Any:
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def pick_device(requested: str = "auto") -> torch.device:
    """The one place that chooses the device: CUDA when available unless told otherwise."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


# --------------------------------------------------------------------------------------------
# Training


@dataclass
class TrainOptions:
    seq_len: int = 512
    batch_size: int = 4
    lr: float = 1.5e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 150
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    steps: int | None = None  # step-driven schedule when set
    budget_seconds: float | None = None  # time-driven schedule (and hard stop) when set
    ckpt_seconds: float = 300.0
    ckpt_every_steps: int | None = None
    log_every: int = 20
    eval_windows: int = 48
    stop_after: int | None = None  # steps in THIS invocation, then checkpoint and return
    seed: int = 0


@dataclass
class TrainState:
    step: int = 0
    epoch: int = 0
    index: int = 0  # next batch within the epoch's permutation
    train_seconds: float = 0.0
    tokens_seen: int = 0
    history: list[dict[str, float]] = field(default_factory=list)
    finished: bool = False


class PackedWindows:
    """Non-overlapping windows of ``seq_len + 1`` tokens over a packed stream, shuffled per epoch
    with a seeded permutation so the data position is just (epoch, index)."""

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, seed: int) -> None:
        self.tokens = torch.from_numpy(tokens.astype(np.int64))
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.seed = seed
        self.num_windows = max(0, (len(tokens) - 1) // seq_len)
        if self.num_windows < batch_size:
            raise ValueError(
                f"{len(tokens)} tokens give {self.num_windows} windows of "
                f"{seq_len}; need at least batch_size={batch_size}"
            )
        self.batches_per_epoch = self.num_windows // batch_size
        self._perm_epoch = -1
        self._perm = torch.empty(0, dtype=torch.long)

    def _window(self, w: int) -> torch.Tensor:
        start = w * self.seq_len
        return self.tokens[start : start + self.seq_len + 1]

    def batch(self, epoch: int, index: int) -> torch.Tensor:
        if epoch != self._perm_epoch:
            g = torch.Generator().manual_seed(self.seed * 1000 + epoch)
            self._perm = torch.randperm(self.num_windows, generator=g)
            self._perm_epoch = epoch
        ids = self._perm[index * self.batch_size : (index + 1) * self.batch_size]
        return torch.stack([self._window(int(w)) for w in ids])

    def spread(self, limit: int) -> Iterator[torch.Tensor]:
        """Up to ``limit`` windows evenly spaced over the whole stream (fixed, for evaluation)."""
        n = min(limit, self.num_windows)
        for i in range(n):
            yield self._window(i * self.num_windows // n)


def lm_loss(model: Any, batch: torch.Tensor, device: torch.device) -> torch.Tensor:
    batch = batch.to(device, non_blocking=True)
    inputs, targets = batch[:, :-1], batch[:, 1:]
    with torch.autocast(
        device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"
    ):
        logits = model(input_ids=inputs, use_cache=False).logits
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))


@torch.no_grad()
def evaluate(
    model: Any, val: PackedWindows | None, device: torch.device, windows: int, batch_size: int
) -> float | None:
    if val is None or windows <= 0:
        return None
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    buf: list[torch.Tensor] = []
    for w in val.spread(windows):
        buf.append(w)
        if len(buf) == batch_size:
            total += lm_loss(model, torch.stack(buf), device).item() * len(buf)
            count += len(buf)
            buf = []
    if buf:
        total += lm_loss(model, torch.stack(buf), device).item() * len(buf)
        count += len(buf)
    model.train(was_training)
    return total / max(count, 1)


def progress(state: TrainState, opts: TrainOptions) -> float:
    """Fraction of the schedule done, by steps or by the time budget."""
    if opts.steps:
        return state.step / opts.steps
    if opts.budget_seconds:
        return state.train_seconds / opts.budget_seconds
    raise ValueError("either steps or budget_seconds must be set")


def lr_at(state: TrainState, opts: TrainOptions) -> float:
    warm = min(1.0, (state.step + 1) / max(1, opts.warmup_steps))
    p = min(1.0, progress(state, opts))
    cos = opts.min_lr_ratio + (1 - opts.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p))
    return opts.lr * warm * cos


def make_optimizer(model: Any, opts: TrainOptions) -> torch.optim.Optimizer:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 and "norm" not in name else no_decay).append(p)
    return torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": opts.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=opts.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )


def save_checkpoint(
    path: Path,
    model: Any,
    optimizer: torch.optim.Optimizer,
    state: TrainState,
    extra: dict[str, Any],
) -> None:
    """Atomic write of model + optimizer + step + data position."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "state": asdict(state),
            **extra,
        },
        tmp,
    )
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=False)


class _StopFlag:
    """Turns SIGTERM/SIGINT into a graceful 'checkpoint and stop'."""

    def __init__(self) -> None:
        self.stop = False
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _StopFlag:
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        logger.warning("signal %d: saving a checkpoint and stopping", signum)
        self.stop = True

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def train(
    model: Any,
    optimizer: torch.optim.Optimizer,
    state: TrainState,
    opts: TrainOptions,
    data: PackedWindows,
    val: PackedWindows | None,
    device: torch.device,
    ckpt_path: Path,
    ckpt_extra: dict[str, Any],
) -> TrainState:
    """Run until the schedule ends (state.finished), ``stop_after`` steps, or a signal."""
    model.to(device).train()
    tokens_per_step = opts.batch_size * opts.seq_len
    start_step = state.step
    last_ckpt = time.monotonic()
    t_log, tok_log, loss_sum, loss_n = time.monotonic(), 0, 0.0, 0

    def checkpoint(reason: str) -> None:
        nonlocal last_ckpt
        t0 = time.monotonic()
        val_loss = evaluate(model, val, device, opts.eval_windows, opts.batch_size)
        if state.history:
            state.history[-1]["val_loss"] = val_loss if val_loss is not None else float("nan")
        save_checkpoint(ckpt_path, model, optimizer, state, ckpt_extra)
        state.train_seconds += time.monotonic() - t0
        last_ckpt = time.monotonic()
        logger.info(
            "checkpoint (%s) at step %d, val_loss %s -> %s",
            reason,
            state.step,
            f"{val_loss:.4f}" if val_loss is not None else "n/a",
            ckpt_path,
        )

    with _StopFlag() as flag:
        while True:
            if progress(state, opts) >= 1.0:
                state.finished = True
                checkpoint("end of schedule")
                break
            if flag.stop or (
                opts.stop_after is not None and state.step - start_step >= opts.stop_after
            ):
                checkpoint("stop requested")
                break
            t0 = time.monotonic()
            lr = lr_at(state, opts)
            for group in optimizer.param_groups:
                group["lr"] = lr
            batch = data.batch(state.epoch, state.index)
            loss = lm_loss(model, batch, device)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), opts.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss_val = loss.item()
            if not math.isfinite(loss_val):
                raise FloatingPointError(f"loss is {loss_val} at step {state.step}")
            state.step += 1
            state.index += 1
            if state.index >= data.batches_per_epoch:
                state.epoch, state.index = state.epoch + 1, 0
            state.tokens_seen += tokens_per_step
            state.train_seconds += time.monotonic() - t0
            loss_sum, loss_n, tok_log = loss_sum + loss_val, loss_n + 1, tok_log + tokens_per_step
            if state.step % opts.log_every == 0 or state.step == 1:
                now = time.monotonic()
                mean = loss_sum / loss_n
                state.history.append(
                    {
                        "step": state.step,
                        "loss": mean,
                        "lr": lr,
                        "tokens": state.tokens_seen,
                        "seconds": round(state.train_seconds, 1),
                    }
                )
                logger.info(
                    "step %6d | loss %.4f | lr %.2e | gnorm %.2f | %5.0f tok/s | %.2fM tok | "
                    "epoch %d.%03d | %5.1f%% of schedule",
                    state.step,
                    mean,
                    lr,
                    float(grad_norm),
                    tok_log / max(now - t_log, 1e-9),
                    state.tokens_seen / 1e6,
                    state.epoch,
                    int(1000 * state.index / data.batches_per_epoch),
                    100 * min(1.0, progress(state, opts)),
                )
                t_log, tok_log, loss_sum, loss_n = now, 0, 0.0, 0
            due_time = time.monotonic() - last_ckpt >= opts.ckpt_seconds
            due_steps = opts.ckpt_every_steps and state.step % opts.ckpt_every_steps == 0
            if due_time or due_steps:
                checkpoint("periodic")
    return state


# --------------------------------------------------------------------------------------------
# Export


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def export(
    ckpt_path: Path,
    tokenizer_dir: Path,
    out_dir: Path,
    manifest: dict[str, Any],
    val_tokens: np.ndarray | None = None,
    dtype: str = "bfloat16",
    eval_windows: int = 48,
    seq_len: int = 512,
    sample: bool = True,
) -> Path:
    """Write config, half-precision safetensors, tokenizer, generation_config and manifest.

    Written to a temporary sibling folder first and then swapped in, so ``out_dir`` is never
    half-written. The exported weights are re-loaded (fp32) to record their held-out loss.
    """
    from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    ckpt = load_checkpoint(ckpt_path)
    tokenizer = load_tokenizer(tokenizer_dir)
    config = LlamaConfig.from_dict(ckpt["model_config"])
    model = build_model(config, seed=0)
    model.load_state_dict(ckpt["model"])
    torch_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[
        dtype
    ]
    model.to(torch_dtype)
    model.config.dtype = dtype
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))

    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp), dtype=torch.float32)
    reloaded.eval()
    state = ckpt["state"]
    info: dict[str, Any] = dict(manifest)
    info["export"] = {
        "dtype": dtype,
        "from_checkpoint_step": state["step"],
        "parameters": sum(p.numel() for p in reloaded.parameters()),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if val_tokens is not None and len(val_tokens) > seq_len + 1:
        val = PackedWindows(val_tokens, seq_len, 1, seed=0)
        loss = evaluate(reloaded, val, torch.device("cpu"), eval_windows, batch_size=4)
        info["export"]["val_loss_exported_weights"] = loss
        logger.info("exported weights (%s, read back in fp32): val_loss %.4f", dtype, loss)
    if sample:
        samples = []
        for prompt in [
            "Hello! Who are you?",
            "What is 12 + 7?",
            "Write a short story about a cat.",
        ]:
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}],
                add_generation_prompt=True,
                return_tensors="pt",
                return_dict=True,
            )
            with torch.no_grad():
                out = reloaded.generate(**ids, max_new_tokens=60, do_sample=False)
            reply = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=False)
            samples.append({"prompt": prompt, "greedy_reply": reply})
            logger.info("sample | %s -> %r", prompt, reply)
        info["export"]["greedy_samples"] = samples
    (tmp / "manifest.json").write_text(
        json.dumps(info, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    for path in out_dir.iterdir():
        path.chmod(0o644)
    size = _dir_bytes(out_dir)
    logger.info("exported %s (%.1f MB)", out_dir, size / 1e6)
    if size > 40e6:
        logger.warning("export is %.1f MB, above the 40 MB budget for the bundled demo", size / 1e6)
    return out_dir


# --------------------------------------------------------------------------------------------
# CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    shape = ModelShape()
    opts = TrainOptions()
    g = parser.add_argument_group("paths")
    g.add_argument(
        "--data-dir",
        type=Path,
        default=DEFAULT_DATA_DIR,
        help="offline training text (read at run time)",
    )
    g.add_argument(
        "--bench-dir",
        default=str(DEFAULT_BENCH_DIR),
        help="benchmark prompts removed from training ('' to skip)",
    )
    g.add_argument(
        "--work-dir",
        type=Path,
        default=DEFAULT_WORK_DIR,
        help="tokenizer, token streams, checkpoints and train.log",
    )
    g.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR, help="export folder")
    g = parser.add_argument_group("run control")
    g.add_argument(
        "--minutes",
        type=float,
        default=None,
        help="training time budget (default 70 unless --steps is given); the "
        "cosine schedule follows it",
    )
    g.add_argument("--steps", type=int, default=None, help="step-driven schedule instead")
    g.add_argument(
        "--fresh",
        action="store_true",
        help="ignore the checkpoint and rebuild tokenizer and token streams",
    )
    g.add_argument("--export-only", action="store_true", help="export the last checkpoint and exit")
    g.add_argument("--no-export", action="store_true", help="do not export when training ends")
    g.add_argument(
        "--stop-after",
        type=int,
        default=None,
        help="checkpoint and stop after this many steps in this invocation",
    )
    g.add_argument("--ckpt-minutes", type=float, default=opts.ckpt_seconds / 60)
    g.add_argument("--ckpt-every-steps", type=int, default=None)
    g.add_argument("--log-every", type=int, default=opts.log_every)
    g.add_argument("--threads", type=int, default=1, help="CPU threads for torch (default 1)")
    g.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda, ...")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--export-dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    g.add_argument(
        "--log-file", type=Path, default=None, help="log file (default WORK_DIR/train.log)"
    )
    g = parser.add_argument_group("data and tokenizer")
    g.add_argument(
        "--sources", default=",".join(SOURCE_NAMES), help=f"comma list of {SOURCE_NAMES}"
    )
    g.add_argument("--max-docs-per-source", type=int, default=None)
    g.add_argument("--val-fraction", type=float, default=0.02)
    g.add_argument("--vocab-size", type=int, default=4096)
    g.add_argument(
        "--tokenizer-chars",
        type=int,
        default=8_000_000,
        help="characters of training text used to learn the BPE merges",
    )
    g = parser.add_argument_group("model shape")
    g.add_argument("--hidden", type=int, default=shape.hidden)
    g.add_argument("--layers", type=int, default=shape.layers)
    g.add_argument("--heads", type=int, default=shape.heads)
    g.add_argument("--kv-heads", type=int, default=shape.kv_heads)
    g.add_argument("--intermediate", type=int, default=shape.intermediate)
    g.add_argument("--max-positions", type=int, default=shape.max_positions)
    g = parser.add_argument_group("optimisation")
    g.add_argument("--seq-len", type=int, default=opts.seq_len)
    g.add_argument("--batch-size", type=int, default=opts.batch_size)
    g.add_argument("--lr", type=float, default=opts.lr)
    g.add_argument("--warmup-steps", type=int, default=opts.warmup_steps)
    g.add_argument("--weight-decay", type=float, default=opts.weight_decay)
    g.add_argument("--eval-windows", type=int, default=opts.eval_windows)


def _setup_logging(log_file: Path) -> logging.Handler:
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
    logger.setLevel(logging.INFO)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(log_file, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    return handler


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def prepare_data(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Build (or reuse) tokenizer + token streams in the work folder; returns the data summary."""
    tok_dir, data_dir = work / "tokenizer", work / "data"
    summary_path = data_dir / "corpus.json"
    if summary_path.exists() and not args.fresh:
        logger.info("reusing tokenizer and token streams in %s", work)
        return json.loads(summary_path.read_text(encoding="utf-8"))
    for d in (tok_dir, data_dir):
        if d.exists():
            shutil.rmtree(d)
    t0 = time.monotonic()
    sources = [s.strip() for s in args.sources.split(",") if s.strip()]
    unknown = sorted(set(sources) - set(SOURCE_NAMES))
    if unknown:
        raise ValueError(f"unknown sources {unknown}; known: {SOURCE_NAMES}")
    bench_dir = Path(args.bench_dir) if args.bench_dir else None
    corpus = collect_corpus(
        Path(args.data_dir),
        sources,
        val_fraction=args.val_fraction,
        seed=args.seed,
        max_docs_per_source=args.max_docs_per_source,
        bench_dir=bench_dir,
    )

    # BPE merges from an evenly spread sample of the (unrepeated) training text.
    def sample_texts() -> Iterator[str]:
        budget = args.tokenizer_chars
        seen: set[int] = set()
        for d in corpus.train:
            if id(d) in seen:
                continue
            seen.add(id(d))
            text = d.plain_text()
            budget -= len(text)
            yield text
            if budget <= 0:
                return

    tokenizer = train_tokenizer(sample_texts(), args.vocab_size, tok_dir, args.max_positions)
    logger.info("tokenizer: %d tokens, trained in %.0f s", len(tokenizer), time.monotonic() - t0)
    train_tokens = tokenize_docs(corpus.train, tokenizer)
    val_tokens = tokenize_docs(corpus.val, tokenizer)
    data_dir.mkdir(parents=True, exist_ok=True)
    np.save(data_dir / "train.npy", train_tokens)
    np.save(data_dir / "val.npy", val_tokens)
    # Per-source token counts (training copies included).
    per_source: dict[str, list[Document]] = {}
    for d in corpus.train:
        per_source.setdefault(d.source, []).append(d)
    for name, docs in per_source.items():
        corpus.stats[name]["train_tokens"] = int(len(tokenize_docs(docs, tokenizer)))
    for name in corpus.stats:
        docs = [d for d in corpus.val if d.source == name]
        corpus.stats[name]["val_tokens"] = int(len(tokenize_docs(docs, tokenizer))) if docs else 0
    total_chars = sum(len(render(d, tokenizer)) for d in corpus.train)
    summary = {
        "data_dir": str(args.data_dir),
        "sources": corpus.stats,
        "train_docs": len(corpus.train),
        "val_docs": len(corpus.val),
        "train_tokens": int(len(train_tokens)),
        "val_tokens": int(len(val_tokens)),
        "chars_per_token": round(total_chars / max(1, len(train_tokens)), 3),
        "train_sha256": _sha256(data_dir / "train.npy"),
        "seed": args.seed,
        "val_fraction": args.val_fraction,
        "system_prompt_fraction": SYSTEM_PROMPT_FRACTION,
        "tokenizer": {
            "kind": "byte-level BPE, digits split",
            "vocab_size": len(tokenizer),
            "special_tokens": SPECIAL_TOKENS,
            "trained_on_chars": args.tokenizer_chars,
        },
    }
    summary_path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    logger.info(
        "corpus: %d train docs = %d tokens (%.2f chars/token), %d held-out docs = %d "
        "tokens; built in %.0f s",
        len(corpus.train),
        len(train_tokens),
        summary["chars_per_token"],
        len(corpus.val),
        len(val_tokens),
        time.monotonic() - t0,
    )
    for name, st in corpus.stats.items():
        logger.info(
            "  %-14s %-34s train %8d tok  val %6d tok",
            name,
            st["licence"],
            st.get("train_tokens", 0),
            st.get("val_tokens", 0),
        )
    return summary


def _manifest(summary: dict[str, Any], ckpt: dict[str, Any]) -> dict[str, Any]:
    import tokenizers
    import transformers

    state = ckpt["state"]
    hist = state.get("history", [])
    return {
        "name": "EagleChat demo target",
        "architecture": "LlamaForCausalLM",
        "built_by": "python -m models.training.demo_target (models/training/demo_target.py)",
        "chat_format": "<|bos|>[<|system|>...<|eos|>]<|user|>...<|eos|><|assistant|>...<|eos|>",
        "trained_context": ckpt["options"]["seq_len"],
        "shape": ckpt["shape"],
        "training": {
            "options": ckpt["options"],
            "steps": state["step"],
            "tokens_seen": state["tokens_seen"],
            "epochs": round(state["tokens_seen"] / max(1, summary["train_tokens"]), 3),
            "train_seconds": round(state["train_seconds"], 1),
            "finished_schedule": state.get("finished", False),
            "final_train_loss": hist[-1]["loss"] if hist else None,
            "val_loss_history": [
                {"step": h["step"], "val_loss": h["val_loss"]} for h in hist if "val_loss" in h
            ],
            "device": ckpt.get("device"),
            "threads": ckpt.get("threads"),
        },
        "data": summary,
        "versions": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
        },
    }


def run(args: argparse.Namespace) -> int:
    work = Path(args.work_dir)
    handler = _setup_logging(Path(args.log_file) if args.log_file else work / "train.log")
    try:
        return _run(args, work)
    except Exception:
        logger.exception("demo target build failed")
        raise
    finally:
        logger.removeHandler(handler)
        handler.close()


def _run(args: argparse.Namespace, work: Path) -> int:
    os.environ.setdefault("RAYON_NUM_THREADS", str(max(1, args.threads)))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(max(1, args.threads))
    ckpt_path = work / "ckpt" / "last.pt"
    tok_dir = work / "tokenizer"

    if args.export_only:
        if not ckpt_path.exists():
            raise FileNotFoundError(f"no checkpoint at {ckpt_path}")
        summary = json.loads((work / "data" / "corpus.json").read_text(encoding="utf-8"))
        ckpt = load_checkpoint(ckpt_path)
        export(
            ckpt_path,
            tok_dir,
            Path(args.out_dir),
            _manifest(summary, ckpt),
            np.load(work / "data" / "val.npy"),
            args.export_dtype,
            args.eval_windows,
            ckpt["options"]["seq_len"],
        )
        return 0

    if args.fresh and ckpt_path.exists():
        ckpt_path.unlink()
    device = pick_device(args.device)
    logger.info(
        "device %s, %d torch thread(s), work folder %s", device, torch.get_num_threads(), work
    )
    summary = prepare_data(args, work)
    tokenizer = load_tokenizer(tok_dir)
    train_tokens = np.load(work / "data" / "train.npy")
    val_tokens = np.load(work / "data" / "val.npy")

    minutes = args.minutes if args.minutes is not None else (None if args.steps else 70.0)
    opts = TrainOptions(
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        weight_decay=args.weight_decay,
        steps=args.steps,
        budget_seconds=minutes * 60 if minutes else None,
        ckpt_seconds=args.ckpt_minutes * 60,
        ckpt_every_steps=args.ckpt_every_steps,
        log_every=args.log_every,
        eval_windows=args.eval_windows,
        stop_after=args.stop_after,
        seed=args.seed,
    )
    shape = ModelShape(
        hidden=args.hidden,
        layers=args.layers,
        heads=args.heads,
        kv_heads=args.kv_heads,
        intermediate=args.intermediate,
        max_positions=args.max_positions,
    )

    state = TrainState()
    ckpt: dict[str, Any] | None = None
    if ckpt_path.exists():
        ckpt = load_checkpoint(ckpt_path)
        if ckpt.get("train_sha256") != summary["train_sha256"]:
            raise RuntimeError(f"{ckpt_path} was trained on other token data; use --fresh")
        if ckpt["shape"] != asdict(shape):
            logger.warning(
                "resuming with the checkpoint's shape %s (ignoring %s)",
                ckpt["shape"],
                asdict(shape),
            )
        shape = ModelShape(**ckpt["shape"])
        for key in ("seq_len", "batch_size", "seed"):
            setattr(opts, key, ckpt["options"][key])  # the data position depends on these
        state = TrainState(**ckpt["state"])
        logger.info(
            "resuming from %s: step %d, epoch %d, batch %d, %.2fM tokens, %.1f min",
            ckpt_path,
            state.step,
            state.epoch,
            state.index,
            state.tokens_seen / 1e6,
            state.train_seconds / 60,
        )

    config = build_config(shape, tokenizer)
    model = build_model(config, args.seed)
    optimizer = make_optimizer(model, opts)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        model.to(device)
        optimizer.load_state_dict(ckpt["optimizer"])
    n_params = sum(p.numel() for p in model.parameters())
    logger.info(
        "model: LlamaForCausalLM %s, %.2fM parameters, vocab %d",
        asdict(shape),
        n_params / 1e6,
        config.vocab_size,
    )

    data = PackedWindows(train_tokens, opts.seq_len, opts.batch_size, opts.seed)
    val = (
        PackedWindows(val_tokens, opts.seq_len, 1, opts.seed)
        if len(val_tokens) > opts.seq_len + 1
        else None
    )
    logger.info(
        "schedule: %s; %d windows of %d, batch %d (%d tokens/step), %d steps/epoch",
        f"{opts.steps} steps" if opts.steps else f"{minutes:g} minutes",
        data.num_windows,
        opts.seq_len,
        opts.batch_size,
        opts.batch_size * opts.seq_len,
        data.batches_per_epoch,
    )
    extra = {
        "model_config": config.to_dict(),
        "shape": asdict(shape),
        "options": asdict(opts),
        "train_sha256": summary["train_sha256"],
        "device": str(device),
        "threads": torch.get_num_threads(),
    }
    state = train(model, optimizer, state, opts, data, val, device, ckpt_path, extra)
    if not state.finished:
        logger.info(
            "stopped at step %d before the end of the schedule; rerun to resume "
            "(or --export-only to export this checkpoint)",
            state.step,
        )
        return 0
    if args.no_export:
        return 0
    ckpt = load_checkpoint(ckpt_path)
    export(
        ckpt_path,
        tok_dir,
        Path(args.out_dir),
        _manifest(summary, ckpt),
        val_tokens,
        args.export_dtype,
        opts.eval_windows,
        opts.seq_len,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m models.training.demo_target",
        description="Build the bundled demo target (tokenizer + small Llama chat model).",
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
