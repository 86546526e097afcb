"""train-head's held-out tau: the bench's measurement on the bench's settings, so that the two
give the same number for the same head and prompts.

    prompts = encode_bench_prompts(tokenizer, load_prompts("held_out.jsonl", 8), "plain")
    evaluate = make_tau_evaluator(model, tokenizer, prompts, eval_generation(128, "16/5/4"))
    tau = evaluate(head)

Like ``launch.py bench``: prompts read by the bench's reader and encoded as it encodes them,
greedy replies of a fixed token budget that stop at EOS only (no chat stop strings), a fixed
tree, and tau pooled over the prompts as (tokens after each reply's first) / rounds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from backend.bench.cli import parse_tree
from backend.bench.prompts import BenchPrompt
from backend.config import GenerationConfig, TreeConfig
from backend.engine.drafter import EagleDrafter
from backend.engine.engine import Engine
from backend.engine.stopping import StopSpec
from backend.engine.target import TargetRunner
from backend.events import Finished, average_acceptance_length
from backend.services.prompting import prompt_ids
from models.chat_format import eos_token_ids
from models.features import decoder_of
from models.heads.base import DraftHead

BENCH_MAX_NEW_TOKENS = 128  # launch.py bench's default token budget
BENCH_TREE = "16/5/4"


def eval_generation(max_new_tokens: int = BENCH_MAX_NEW_TOKENS, tree: str = BENCH_TREE):
    """Greedy replies of ``max_new_tokens`` through the fixed tree ``tree`` (N/D/K or chainD)."""
    return GenerationConfig(max_new_tokens=max_new_tokens, tree=parse_tree(tree))


def encode_bench_prompts(
    tokenizer, prompts: Sequence[BenchPrompt], prompt_format: str
) -> list[list[int]]:
    """Bench prompts (``load_prompts``) encoded as the bench encodes them."""
    return [
        prompt_ids(tokenizer, [{"role": "user", "content": p.text}], prompt_format=prompt_format)
        for p in prompts
    ]


def make_tau_evaluator(
    model, tokenizer, prompts: Sequence[list[int]], config: GenerationConfig | None = None
) -> Callable[[DraftHead], float]:
    """evaluate(head) -> tau over all ``prompts``, greedy, through the engine the app and the
    bench use. The tree is fixed (auto-tuning off): tau then measures the head, not the
    machine's timings, and is reproducible."""
    config = config or eval_generation()
    tree = config.tree if not config.tree.auto else TreeConfig()
    config = replace(config, tree=replace(tree, auto=False))
    eos_ids = frozenset(eos_token_ids(model, tokenizer))
    num_layers = len(decoder_of(model).layers)

    def evaluate(head: DraftHead) -> float:
        tokens = rounds = 0
        for prompt in prompts:
            drafter = EagleDrafter(head, num_layers)
            runner = TargetRunner(model, drafter.feature_indices)
            engine = Engine(runner, drafter, stops=StopSpec(eos_ids=eos_ids))
            events = list(engine.generate(list(prompt), config))
            summary = next(e for e in reversed(events) if isinstance(e, Finished)).summary
            tokens += max(0, len(summary.token_ids) - 1)  # every token after the first: rounds'
            rounds += summary.rounds
        return average_acceptance_length(tokens, rounds)

    return evaluate
