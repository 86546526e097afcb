"""Continuations written by the target itself from prompts cut out of plain text: a base model's
head then trains on what the model writes (its loops and repeats included), not only on what
people wrote.

    prompts = cut_prompts(tokenizer, passages, options)
    done = continue_prompts(model, tokenizer, prompts, options, Path("out/continuations.jsonl"))
    examples = [c.example(special_ids) for c in done]

Generation is batched with the KV cache (``model.generate`` on left-padded prompts of similar
length); a seeded share of the prompts is continued by sampling, the rest greedily. Every
finished batch is appended to the JSONL file at once, so an interrupted run continues with the
first unfinished batch, and a finished file is read back instead of generating again.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from models.chat_format import eos_token_ids, plain_text_ids
from models.errors import ConfigError
from models.training.data import TokenizedExample

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ContinuationOptions:
    max_new_tokens: int = 256  # per continuation (it may end earlier at an end-of-text token)
    sampled_share: float = 0.5  # share of the prompts continued by sampling; the rest greedy
    temperature: float = 0.8  # of the sampled ones
    batch_size: int = 16  # sequences per generate call
    max_prompts: int = 0  # at most this many prompts, a seeded choice; 0 = all
    max_length: int = 2048  # prompt + continuation tokens; longer prompts are cut
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.sampled_share <= 1.0:
            raise ConfigError(f"the sampled share must be in 0..1, got {self.sampled_share}")
        if self.sampled_share > 0 and self.temperature <= 0:
            raise ConfigError("sampled continuations need a temperature above 0")
        if self.max_new_tokens < 1 or self.batch_size < 1:
            raise ConfigError("max_new_tokens and batch_size must be at least 1")
        if self.max_length <= self.max_new_tokens:
            raise ConfigError("max_length must leave room for a prompt before the continuation")


@dataclass(frozen=True, slots=True)
class Prompt:
    index: int  # position in the prompt list (the key a resumed run matches on)
    ids: list[int]  # with the tokenizer's special tokens (a base model's BOS)
    sampled: bool  # continued by sampling rather than greedily


@dataclass(frozen=True, slots=True)
class Continuation:
    index: int
    prompt_ids: list[int]
    new_ids: list[int]  # what the target wrote (an end-of-text token included)
    sampled: bool

    def example(self, special_ids: Iterable[int]) -> TokenizedExample:
        """Prompt and continuation as one training sequence: every token but the special ones
        in the prompt (BOS) carries loss."""
        special = set(special_ids)
        mask = [int(token not in special) for token in self.prompt_ids] + [1] * len(self.new_ids)
        return TokenizedExample(self.prompt_ids + self.new_ids, mask)


def cut_prompts(tokenizer, passages: Sequence[str], options: ContinuationOptions) -> list[Prompt]:
    """One prompt per passage (tokenised as plain text, cut to leave room for the
    continuation), at most ``options.max_prompts`` of them by a seeded choice; a seeded
    ``options.sampled_share`` of them is marked for sampling."""
    chosen = list(range(len(passages)))
    if 0 < options.max_prompts < len(chosen):
        chosen = sorted(random.Random(options.seed).sample(chosen, options.max_prompts))
    room = options.max_length - options.max_new_tokens
    sampled = set(
        random.Random(options.seed + 1).sample(
            range(len(chosen)), round(options.sampled_share * len(chosen))
        )
    )
    return [
        Prompt(number, plain_text_ids(tokenizer, passages[index])[:room], number in sampled)
        for number, index in enumerate(chosen)
    ]


def batch_plan(prompts: Sequence[Prompt], batch_size: int) -> list[list[Prompt]]:
    """Greedy and sampled prompts in separate batches, each of similar prompt lengths (little
    padding); a pure function of the prompts, so a resumed run batches them alike."""
    batches = []
    for sampled in (False, True):
        group = sorted((p for p in prompts if p.sampled == sampled), key=lambda p: len(p.ids))
        batches += [group[at : at + batch_size] for at in range(0, len(group), batch_size)]
    return batches


@torch.no_grad()
def continue_prompts(
    model,
    tokenizer,
    prompts: Sequence[Prompt],
    options: ContinuationOptions,
    path: Path,
    progress: Callable[[int, int], None] | None = None,
) -> list[Continuation]:
    """The target's continuation of every prompt, in prompt order. Those already in ``path``
    (from an interrupted or finished run with the same prompts) are read back; the rest are
    generated batch by batch and appended. ``progress(done, total)`` counts prompts."""
    done = read_continuations(path, prompts)
    plan = batch_plan(prompts, options.batch_size)
    eos_ids = eos_token_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    device = model.get_input_embeddings().weight.device
    if progress is not None:
        progress(len(done), len(prompts))
    path.parent.mkdir(parents=True, exist_ok=True)
    for number, batch in enumerate(plan):
        if all(p.index in done for p in batch):
            continue
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(options.seed * 1_000_003 + number)  # the same batch, the same draw
            made = _generate(model, batch, options, eos_ids, pad_id)
        with path.open("a", encoding="utf-8") as file:  # one write per batch
            file.write("".join(_record_line(tokenizer, c) for c in made))
        done.update({c.index: c for c in made})
        if progress is not None:
            progress(len(done), len(prompts))
    return [done[p.index] for p in prompts]


def _generate(
    model, batch: Sequence[Prompt], options: ContinuationOptions, eos_ids: list[int], pad_id: int
) -> list[Continuation]:
    """One ``generate`` call on left-padded prompts; each row cut after its first end token."""
    device = model.get_input_embeddings().weight.device
    width = max(len(p.ids) for p in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for row, prompt in enumerate(batch):
        ids[row, width - len(prompt.ids) :] = torch.tensor(prompt.ids)
        attention[row, width - len(prompt.ids) :] = 1
    sampled = batch[0].sampled
    choice = (
        {"do_sample": True, "temperature": options.temperature, "top_k": 0, "top_p": 1.0}
        if sampled
        else {"do_sample": False}
    )
    output = model.generate(
        input_ids=ids.to(device),
        attention_mask=attention.to(device),
        max_new_tokens=options.max_new_tokens,
        eos_token_id=eos_ids or None,
        pad_token_id=pad_id,
        **choice,
    )
    made = []
    for row, prompt in enumerate(batch):
        new = output[row, width:].tolist()
        end = next((i + 1 for i, token in enumerate(new) if token in eos_ids), len(new))
        made.append(Continuation(prompt.index, prompt.ids, new[:end], sampled))
    return made


def _record_line(tokenizer, continuation: Continuation) -> str:
    """A JSONL line: the ids (what trains) and the texts (for people reading the file)."""
    record = asdict(continuation)
    record["prompt"] = tokenizer.decode(continuation.prompt_ids, skip_special_tokens=True)
    record["continuation"] = tokenizer.decode(continuation.new_ids, skip_special_tokens=True)
    return json.dumps(record, ensure_ascii=False) + "\n"


def read_continuations(path: Path, prompts: Sequence[Prompt]) -> dict[int, Continuation]:
    """The continuations in ``path`` by prompt index; a torn last line (an interrupted write)
    is ignored. Records made from other prompts raise: the file belongs to another run."""
    if not path.is_file():
        return {}
    by_index = {p.index: p for p in prompts}
    found: dict[int, Continuation] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        prompt = by_index.get(record.get("index"))
        if prompt is None or record.get("prompt_ids") != prompt.ids:
            raise ConfigError(
                f"{path} holds continuations of other prompts",
                hint="delete it, or train into another --out directory",
            )
        found[prompt.index] = Continuation(
            prompt.index, prompt.ids, list(record["new_ids"]), bool(record["sampled"])
        )
    return found
