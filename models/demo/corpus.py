"""The demo target's training text: permissively licensed offline data sets (read at run time
from the data folder), each turned into chat or plain-text documents, cleaned, filtered and split
into training and held-out documents."""

from __future__ import annotations

import gzip
import json
import logging
import random
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

ASSISTANT_NAME = "EagleChat demo"
AUTHOR_NAME = "the EagleChat team"

SYSTEM_PROMPTS = [
    f"You are {ASSISTANT_NAME}, a small helpful assistant.",
    "You are a helpful assistant.",
    "You are a friendly assistant. Answer clearly and briefly.",
    f"You are {ASSISTANT_NAME}, made by {AUTHOR_NAME}. Be helpful and honest.",
]
SYSTEM_PROMPT_FRACTION = 0.15  # share of chat documents that get a system turn


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


@dataclass
class _SourceDocs:
    """One source's documents after filtering, with what was dropped and why."""

    docs: list[Document]
    read: int
    bench_overlap: int
    non_ascii: int


def _read_source(src: Source, files: list[Path], bench: set[str]) -> _SourceDocs:
    """All documents of a source minus benchmark prompts and non-English text."""
    docs = list(src.loader(src.name, files))
    n_read = len(docs)
    if bench:
        docs = [d for d in docs if not _asks_bench_prompt(d, bench)]
    n_bench = n_read - len(docs)
    docs = [d for d in docs if _mostly_ascii(d.plain_text())]
    return _SourceDocs(docs, n_read, n_bench, n_read - n_bench - len(docs))


def _asks_bench_prompt(doc: Document, bench: set[str]) -> bool:
    return bool(doc.messages) and any(
        m["role"] == "user" and _norm(m["content"]) in bench for m in doc.messages
    )


def _held_out_count(docs: list[Document], val_fraction: float) -> int:
    """At least one held-out document per source of ten or more (when any are held out)."""
    if len(docs) < 10:
        return 0
    n_val = int(len(docs) * val_fraction)
    return max(1, n_val) if val_fraction > 0 else n_val


def _source_stats(
    src: Source, files: list[Path], data_dir: Path, read: _SourceDocs, split: tuple[list, list]
) -> dict[str, Any]:
    src_train, src_val = split
    return {
        "files": [str(p.relative_to(data_dir)) for p in files]
        if len(files) <= 8
        else f"{src.files} ({len(files)} files)",
        "licence": src.licence,
        "kind": src.kind,
        "docs_read": read.read,
        "dropped_bench_overlap": read.bench_overlap,
        "dropped_non_ascii": read.non_ascii,
        "docs_used": len(src_train) + len(src_val),
        "train_docs": len(src_train),
        "val_docs": len(src_val),
        "repeat": src.repeat,
        "train_chars": sum(len(d.plain_text()) for d in src_train) * src.repeat,
        "note": src.note,
    }


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
    bench = load_bench_prompts(bench_dir)
    train: list[Document] = []
    val: list[Document] = []
    stats: dict[str, dict[str, Any]] = {}
    for src in (s for s in SOURCES if sources is None or s.name in sources):
        files = sorted(data_dir.glob(src.files)) if src.files else []
        if src.files and not files:
            logger.warning(
                "source %s: no files match %s in %s, skipped", src.name, src.files, data_dir
            )
            continue
        read = _read_source(src, files, bench)
        rng = random.Random(f"{seed}:{src.name}")
        rng.shuffle(read.docs)
        cap = min(x for x in (src.max_docs, max_docs_per_source, len(read.docs)) if x is not None)
        docs = read.docs[:cap]
        n_val = _held_out_count(docs, val_fraction)
        src_val, src_train = docs[:n_val], docs[n_val:]
        if src.kind == "chat":
            for d in src_train + src_val:
                if rng.random() < SYSTEM_PROMPT_FRACTION and d.messages:
                    d.messages.insert(0, {"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
        train.extend(src_train * src.repeat)
        val.extend(src_val)
        stats[src.name] = _source_stats(src, files, data_dir, read, (src_train, src_val))
        logger.info(
            "source %-14s %6d docs read, %6d used (%d held out, x%d), %9d chars",
            src.name,
            read.read,
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
