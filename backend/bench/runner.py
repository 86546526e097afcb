"""Run vanilla decoding, EAGLE and transformers' prompt-lookup assisted generation of the same
target on the same prompts, interleaved prompt by prompt so machine drift hits all alike.

    python launch.py bench --pair demo --out bench-results/demo-cpu
"""

from __future__ import annotations

import logging
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from backend.bench.prompts import BenchPrompt
from backend.config import GenerationConfig, SamplingConfig, TreeConfig
from backend.engine.autotune import CostModel
from backend.engine.loop import generate
from backend.events import Finished, RoundCompleted
from backend.services.loading import LoadedPair
from backend.services.prompting import prompt_ids

logger = logging.getLogger(__name__)

METHODS = ("vanilla", "eagle", "prompt_lookup")


@dataclass(frozen=True, slots=True)
class MethodRun:
    """One method on one prompt."""

    method: str
    token_ids: tuple[int, ...]
    seconds: float  # generation wall time, prefill included
    ttft_s: float
    rounds: int  # target forwards after the prefill (0 when unknown)
    accept_lengths: tuple[int, ...]  # accepted drafts per round (EAGLE only)
    draft_s: float = 0.0
    verify_s: float = 0.0
    tree_sizes: tuple[int, ...] = ()

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class PromptResult:
    prompt: BenchPrompt
    runs: dict[str, MethodRun] = field(default_factory=dict)


@dataclass
class BenchResult:
    settings: dict[str, Any]
    costs: dict[str, Any]
    prompts: list[PromptResult]

    def to_json(self) -> dict[str, Any]:
        return {
            "settings": self.settings,
            "costs": self.costs,
            "prompts": [
                {"prompt": asdict(p.prompt), "runs": {m: asdict(r) for m, r in p.runs.items()}}
                for p in self.prompts
            ],
        }


def run_engine(pair: LoadedPair, ids: list[int], config: GenerationConfig, costs) -> MethodRun:
    drafter = pair.drafter if config.mode == "eagle" else None
    sizes, summary = [], None
    policy = pair.tree_policy(not config.sampling.greedy) if drafter is not None else None
    for event in generate(
        pair.runner, drafter, ids, config, pair.eos_ids, costs=costs, policy=policy
    ):
        if isinstance(event, RoundCompleted) and event.round_index > 0:
            sizes.append(event.tree_size)
        elif isinstance(event, Finished):
            summary = event.summary
    assert summary is not None
    return MethodRun(
        method=config.mode, token_ids=summary.token_ids, seconds=summary.total_s,
        ttft_s=summary.ttft_s, rounds=summary.rounds,
        accept_lengths=summary.accept_lengths if config.mode == "eagle" else (),
        draft_s=summary.draft_s, verify_s=summary.verify_s, tree_sizes=tuple(sizes),
    )  # fmt: skip


def run_prompt_lookup(pair: LoadedPair, ids: list[int], config: GenerationConfig) -> MethodRun:
    """transformers' own prompt-lookup decoding (assisted generation) on the same target."""
    model = pair.model
    inputs = torch.tensor([ids], device=pair.runner.device)
    sampling = config.sampling
    kwargs: dict[str, Any] = {"do_sample": not sampling.greedy}
    if not sampling.greedy:
        kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
        torch.manual_seed(sampling.seed or 0)
    start = time.perf_counter()
    with torch.inference_mode():
        output = model.generate(
            inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=config.max_new_tokens,
            prompt_lookup_num_tokens=10, eos_token_id=list(pair.eos_ids) or None,
            pad_token_id=pair.eos_ids[0] if pair.eos_ids else 0, **kwargs,
        )  # fmt: skip
    seconds = time.perf_counter() - start
    new = tuple(output[0, len(ids) :].tolist())
    return MethodRun("prompt_lookup", new, seconds, ttft_s=0.0, rounds=0, accept_lengths=())


def median_run(runs: list[MethodRun]) -> MethodRun:
    """The run with the median seconds per generated token (the lower middle for even counts)."""
    ordered = sorted(runs, key=lambda run: run.seconds / max(len(run.token_ids), 1))
    return ordered[(len(ordered) - 1) // 2]


def machine_description() -> str:
    """CPU model, core count and torch threads (and the GPU name when one is used)."""
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    text = f"{model}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"
    if torch.cuda.is_available():
        text += f", {torch.cuda.get_device_name(0)}"
    return text


def run_bench(
    pair: LoadedPair,
    prompts: list[BenchPrompt],
    max_new_tokens: int,
    temperature: float,
    tree: TreeConfig,
    methods: tuple[str, ...] = METHODS,
    progress: Callable[[int, int, str], None] | None = None,
    repeats: int = 1,
) -> BenchResult:
    """Every prompt runs ``repeats`` times per method, methods interleaved; the run with the
    median time per token counts, so a burst of load on a shared machine hits no method alone."""
    costs: CostModel | None = pair.tree_costs()
    results: list[PromptResult] = []
    encoded = [
        prompt_ids(
            pair.tokenizer, [{"role": "user", "content": p.text}], prompt_format=pair.prompt_format
        )
        for p in prompts
    ]
    warmup = GenerationConfig(mode="vanilla", max_new_tokens=8)
    run_engine(pair, encoded[0], warmup, costs)
    if "eagle" in methods:
        run_engine(
            pair, encoded[0], GenerationConfig(mode="eagle", max_new_tokens=8, tree=tree), costs
        )
    for index, (prompt, ids) in enumerate(zip(prompts, encoded)):
        sampling = SamplingConfig(temperature=temperature, seed=index)
        result = PromptResult(prompt)
        runs: dict[str, list[MethodRun]] = {method: [] for method in methods}
        for _ in range(max(1, repeats)):
            for method in methods:
                if progress is not None:
                    progress(index, len(prompts), method)
                if method == "prompt_lookup":
                    config = GenerationConfig(
                        mode="vanilla", max_new_tokens=max_new_tokens, sampling=sampling
                    )
                    runs[method].append(run_prompt_lookup(pair, ids, config))
                else:
                    config = GenerationConfig(
                        mode=method, max_new_tokens=max_new_tokens, sampling=sampling, tree=tree
                    )
                    runs[method].append(run_engine(pair, ids, config, costs))
        result.runs = {method: median_run(done) for method, done in runs.items()}
        results.append(result)
    settings = {
        "target": pair.target_path, "head": pair.head_path, "head_kind": pair.info.head_kind,
        "device": str(pair.runner.device), "dtype": pair.info.dtype,
        "machine": machine_description(),
        "temperature": temperature, "max_new_tokens": max_new_tokens,
        "tree": "auto" if tree.auto else f"{tree.total_tokens}/{tree.depth}/{tree.top_k} {tree.shape}",
        "num_prompts": len(prompts), "repeats": max(1, repeats), "torch": torch.__version__,
        "prompt_tokens_mean": round(sum(map(len, encoded)) / max(1, len(encoded)), 1),
        "prompt_tokens_min": min(map(len, encoded), default=0),
    }  # fmt: skip
    cost_info = (
        {
            "step_s": costs.verify(1),
            "verify_ratio": {
                str(n): round(costs.verify_ratio(n), 3) for n in sorted(costs.verify_s)
            },
            "draft_step_ratio": round(costs.draft_step_s / costs.verify(1), 3),
            "chain_step_ratio": round(costs.step_s(chain=True) / costs.verify(1), 3),
        }
        if costs
        else {}
    )
    return BenchResult(settings=settings, costs=cost_info, prompts=results)
