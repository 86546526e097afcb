"""Benchmark prompt sets in FastChat's question format: one JSON object a line with
``turns`` (the first turn is used). The project's own set is assets/bench_prompts.jsonl; the
papers' sets (MT-bench, HumanEval, GSM8K, Alpaca) read the same way. A ``.txt`` file gives
passages of plain text (held-out text for base models, long contexts). The sets whose replies
repeat their context (multi-turn ones included) are built in prompt_sets.py."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from backend.errors import InputError
from models.chat_format import text_chunks

BUILTIN_PROMPTS = Path(__file__).resolve().parents[2] / "assets" / "bench_prompts.jsonl"


@dataclass(frozen=True, slots=True)
class BenchPrompt:
    question_id: str
    category: str
    text: str
    earlier: tuple[str, ...] = ()  # earlier user turns, played (and answered) before ``text``


def load_prompts(
    path: str | Path | None = None, limit: int | None = None, text_chars: int = 600
) -> list[BenchPrompt]:
    """FastChat questions, or from a .txt file consecutive passages of up to ``text_chars``
    characters (cut at line or sentence ends): text for a base model to continue."""
    path = Path(path) if path else BUILTIN_PROMPTS
    if not path.is_file():
        raise InputError(f"prompt file {path} does not exist")
    if path.suffix == ".txt":
        passages = text_chunks(path.read_text(encoding="utf-8"), text_chars)
        prompts = [BenchPrompt(f"{path.stem}-{i}", "text", p) for i, p in enumerate(passages)]
        if not prompts:
            raise InputError(f"prompt file {path} has no text")
        return prompts[:limit] if limit else prompts
    prompts = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            text = record["turns"][0]
        except (json.JSONDecodeError, KeyError, IndexError, TypeError) as err:
            raise InputError(
                f"{path}:{number} is not a FastChat question (needs a 'turns' list)"
            ) from err
        prompts.append(
            BenchPrompt(str(record.get("question_id", number)), record.get("category", ""), text)
        )
    if not prompts:
        raise InputError(f"prompt file {path} has no prompts")
    return prompts[:limit] if limit else prompts


def save_prompts(path: str | Path, prompts: list[BenchPrompt]) -> None:
    """FastChat questions, one a line, as :func:`load_prompts` reads them back."""
    lines = [
        json.dumps(
            {"question_id": p.question_id, "category": p.category, "turns": [p.text]},
            ensure_ascii=False,
        )
        for p in prompts
    ]
    Path(path).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
