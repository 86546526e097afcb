"""Prompt sets where the reply repeats its context, built at run time from the shared bench and
training text (``../shared`` beside the repository, or ``$EAGLECHAT_SHARED``): the workloads
where drafts copied from the context pay.

- ``code-rewrite``: a HumanEval function with its solution, to be written out again with one
  name changed (an edit in place: almost every token is a copy);
- ``quotes``: a held-out TinyStories passage and a question answered with exact quotes;
- ``structured``: a document of repeated fields (self-instruct tasks as Task / Instruction /
  Input / Output blocks) to be continued in the same structure;
- ``multi-turn``: MT-bench's two-turn questions; the bench plays the first turn, and the second
  (often "rewrite your previous answer ...") is measured;
- ``repeats``: the four in turn (one prompt of each, then the next of each ...).
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from backend.bench.prompts import BenchPrompt
from backend.errors import InputError
from models.chat_format import text_chunks

ROOT = Path(__file__).resolve().parents[2]
SET_SIZE = 20


def shared_root() -> Path:
    return Path(os.environ.get("EAGLECHAT_SHARED", ROOT.parent / "shared"))


def _read(relative: str) -> str:
    path = shared_root() / relative
    if not path.is_file():
        raise InputError(
            f"the prompt set needs {path}, which does not exist",
            hint="set EAGLECHAT_SHARED to the folder holding bench/ and data/",
        )
    return path.read_text(encoding="utf-8")


def _records(relative: str) -> list[dict]:
    return [json.loads(line) for line in _read(relative).splitlines() if line.strip()]


def code_rewrite() -> list[BenchPrompt]:
    prompts = []
    for record in _records("bench/humaneval.jsonl"):
        code = record["turns"][0].split("\n", 1)[1] + record.get("reference", [""])[0]
        name = re.search(r"def (\w+)\(", code)
        if name is None:
            continue
        prompts.append(
            BenchPrompt(
                f"code-rewrite-{record['question_id']}",
                "code-rewrite",
                f"Here is a Python function:\n\n```python\n{code.strip()}\n```\n\nWrite it out "
                f"again with `{name[1]}` renamed to `{name[1]}_v2` and nothing else changed:"
                "\n\n```python\n",
            )
        )
    return prompts


def quotes() -> list[BenchPrompt]:
    passages = text_chunks(_read("data/tinystories/tinystories_val.txt"), 600)
    prompts = []
    for index, passage in enumerate(passages):
        names = Counter(re.findall(r"\b[A-Z][a-z]{2,}\b", passage))
        for common in ("The", "She", "He", "They", "One", "Once", "But", "Then", "When", "It"):
            names.pop(common, None)
        if not names:
            continue
        subject = names.most_common(1)[0][0]
        prompts.append(
            BenchPrompt(
                f"quotes-{index}",
                "quotes",
                f"Passage:\n{passage}\n\nQuestion: What does the passage say about {subject}? "
                f'Answer with exact quotes from the passage.\nAnswer: "',
            )
        )
    return prompts


def structured() -> list[BenchPrompt]:
    tasks = _records("data/self-instruct/seed_tasks.jsonl")
    prompts = []
    for start in range(0, len(tasks) - 3, 3):
        blocks = []
        for number, task in enumerate(tasks[start : start + 3], start=1):
            instance = task["instances"][0]
            blocks.append(
                f"Task {number}: {task['name']}\nInstruction: {task['instruction']}\n"
                f"Input: {instance['input'] or '(none)'}\nOutput: {instance['output']}\n"
            )
        text = "A list of tasks, each with its instruction, input and output.\n\n"
        prompts.append(
            BenchPrompt(f"structured-{start}", "structured", text + "\n".join(blocks) + "\nTask 4:")
        )
    return prompts


def multi_turn() -> list[BenchPrompt]:
    return [
        BenchPrompt(
            f"multi-turn-{record['question_id']}",
            record.get("category", ""),
            record["turns"][1],
            earlier=(record["turns"][0],),
        )
        for record in _records("bench/mt_bench.jsonl")
        if len(record["turns"]) > 1
    ]


def repeats() -> list[BenchPrompt]:
    sets = [code_rewrite(), quotes(), structured(), multi_turn()]
    return [prompt for group in zip(*sets) for prompt in group]


SETS: dict[str, Callable[[], list[BenchPrompt]]] = {
    "code-rewrite": code_rewrite,
    "quotes": quotes,
    "structured": structured,
    "multi-turn": multi_turn,
    "repeats": repeats,
}


def build_set(name: str) -> list[BenchPrompt]:
    """The first SET_SIZE prompts of a named set."""
    return SETS[name]()[:SET_SIZE]
