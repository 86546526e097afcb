"""Run vanilla decoding, EAGLE and transformers' prompt-lookup assisted generation of the same
target on the same prompts, interleaved prompt by prompt so machine drift hits all alike.

    python launch.py bench --pair demo --out bench-results/demo-cpu
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import torch

from backend.bench.context_ceiling import LONGEST, oracle_rounds
from backend.bench.prompts import BenchPrompt
from backend.config import DraftSources, GenerationConfig, SamplingConfig, TreeConfig
from backend.engine.calibration import CostModel
from backend.engine.device import hardware_name
from backend.events import Finished, RoundCompleted
from backend.services.loading import LoadedPair
from backend.services.prompting import prompt_ids

logger = logging.getLogger(__name__)

METHODS = ("vanilla", "eagle", "generate", "prompt_lookup")
# rows run by another model than the loaded pair's (bench --quantize, --peer)
FLOAT_BASELINE = "vanilla_float32"  # vanilla decoding of the unquantized target
LLAMA_CPP = "llama.cpp"  # plain llama.cpp decoding of the target's GGUF file
ROW_ORDER = (*METHODS, FLOAT_BASELINE, LLAMA_CPP)
# a row run by something else than the pair's engine: (prompt ids, config) -> its run
Peer = Callable[[list[int], GenerationConfig], "MethodRun"]


@dataclass(frozen=True, slots=True)
class MethodRun:
    """One method on one prompt."""

    method: str
    token_ids: tuple[int, ...]
    seconds: float  # generation wall time, prefill included
    ttft_s: float
    rounds: int  # target forwards after the prefill (0 when unknown)
    acceptance_lengths: tuple[int, ...]  # tokens gained per round (EAGLE only; events.py)
    draft_s: float = 0.0
    verify_s: float = 0.0
    tree_sizes: tuple[int, ...] = ()
    peak_memory_bytes: int | None = None  # device memory peak during the run (CUDA only)
    tree_shapes: tuple[tuple[str, int], ...] = ()  # rounds per verified shape (EAGLE)
    prompt_head_s: float = 0.0  # EAGLE's head over the prompt: prompt work, after the first token
    accepted_head: int = 0  # accepted drafts the head proposed
    accepted_context: int = 0  # accepted drafts copied from the context

    @property
    def decode_s(self) -> float:
        """The time after all prompt work: the rounds."""
        return self.seconds - self.ttft_s - self.prompt_head_s

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class PromptResult:
    prompt: BenchPrompt
    seed: int = 0  # which pass over the prompt set (sampling runs one per seed)
    runs: dict[str, MethodRun] = field(default_factory=dict)
    ceiling_rounds: int | None = None  # rounds of an oracle of context drafts over vanilla's reply


@dataclass
class BenchResult:
    settings: dict[str, Any]
    costs: dict[str, Any]
    prompts: list[PromptResult]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BenchResult:
        """A result read back from its ``results.json``."""
        prompts = [
            PromptResult(
                BenchPrompt(
                    **{k: tuple(v) if k == "earlier" else v for k, v in p["prompt"].items()}
                ),
                p["seed"],
                {m: _method_run(run) for m, run in p["runs"].items()},
                p.get("ceiling_rounds"),
            )
            for p in data["prompts"]
        ]
        return cls(data["settings"], data["costs"], prompts)

    def to_json(self) -> dict[str, Any]:
        return {
            "settings": self.settings,
            "costs": self.costs,
            "prompts": [
                {
                    "prompt": asdict(p.prompt),
                    "seed": p.seed,
                    "runs": {m: asdict(r) for m, r in p.runs.items()},
                    "ceiling_rounds": p.ceiling_rounds,
                }
                for p in self.prompts
            ],
        }


def _method_run(data: dict[str, Any]) -> MethodRun:
    tuples = ("token_ids", "acceptance_lengths", "tree_sizes")
    fields = {k: tuple(v) if k in tuples else v for k, v in data.items()}
    fields["tree_shapes"] = tuple(tuple(shape) for shape in data.get("tree_shapes", ()))
    return MethodRun(**fields)


def run_engine(pair: LoadedPair, ids: list[int], config: GenerationConfig) -> MethodRun:
    """Our engine on one prompt, stopping at EOS only, as ``model.generate()`` does."""
    sizes, summary = [], None
    for event in pair.engine.tokens_only().generate(ids, config):
        if isinstance(event, RoundCompleted) and event.round_index > 0:
            sizes.append(event.tree_size)
        elif isinstance(event, Finished):
            summary = event.summary
    assert summary is not None
    return MethodRun(
        method=config.mode,
        token_ids=summary.token_ids,
        seconds=summary.total_s,
        ttft_s=summary.ttft_s,
        rounds=summary.rounds,
        acceptance_lengths=summary.acceptance_lengths if config.mode == "eagle" else (),
        draft_s=summary.draft_s,
        verify_s=summary.verify_s,
        tree_sizes=tuple(sizes),
        tree_shapes=summary.tree_shapes if config.mode == "eagle" else (),
        prompt_head_s=summary.prompt_head_s,
        accepted_head=summary.accepted_head,
        accepted_context=summary.accepted_context,
    )


def run_prompt_lookup(pair: LoadedPair, ids: list[int], config: GenerationConfig) -> MethodRun:
    """transformers' own prompt-lookup decoding (assisted generation) on the same target."""
    return _hf_generate("prompt_lookup", pair, ids, config, prompt_lookup_num_tokens=10)


def run_generate(pair: LoadedPair, ids: list[int], config: GenerationConfig) -> MethodRun:
    """Plain ``model.generate()``: the library's own decoding loop, as a reference for ours."""
    return _hf_generate("generate", pair, ids, config)


def _hf_generate(
    method: str, pair: LoadedPair, ids: list[int], config: GenerationConfig, **extra: Any
) -> MethodRun:
    model = pair.model
    inputs = torch.tensor([ids], device=pair.engine.runner.device)
    sampling = config.sampling
    kwargs: dict[str, Any] = {"do_sample": not sampling.greedy, **extra}
    if not sampling.greedy:
        kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
        torch.manual_seed(sampling.seed or 0)
    start = time.perf_counter()
    with torch.inference_mode():
        output = model.generate(
            inputs,
            attention_mask=torch.ones_like(inputs),
            max_new_tokens=config.max_new_tokens,
            eos_token_id=list(pair.engine.eos_ids) or None,
            pad_token_id=pair.engine.eos_ids[0] if pair.engine.eos_ids else 0,
            **kwargs,
        )
    seconds = time.perf_counter() - start
    new = tuple(output[0, len(ids) :].tolist())
    return MethodRun(method, new, seconds, ttft_s=0.0, rounds=0, acceptance_lengths=())


def median_run(runs: list[MethodRun]) -> MethodRun:
    """The run with the median seconds per generated token (the lower middle for even counts)."""
    ordered = sorted(runs, key=lambda run: run.seconds / max(len(run.token_ids), 1))
    return ordered[(len(ordered) - 1) // 2]


def machine_description(device: torch.device) -> str:
    """The hardware and torch's thread count."""
    return f"{hardware_name(device)}, {torch.get_num_threads()} torch threads"


def tree_method(tree: TreeConfig) -> str:
    """The method name of EAGLE with a fixed tree, e.g. ``eagle@16/5/4``."""
    return f"eagle@{tree.label()}"


def drafts_method(drafts: str) -> str:
    """The method name of auto EAGLE drafting from other sources, e.g. ``eagle:head``."""
    return f"eagle:{drafts}"


@dataclass(frozen=True, slots=True)
class BenchSpec:
    """What one bench run measures (the same for every method)."""

    max_new_tokens: int = 128
    temperature: float = 0.0
    tree: TreeConfig = field(default_factory=lambda: TreeConfig(auto=True))
    methods: tuple[str, ...] = METHODS
    repeats: int = 1  # runs per prompt, method and seed; the median run counts
    seeds: int = 1  # at temperature > 0, the whole prompt set once per seed
    compare_trees: tuple[TreeConfig, ...] = ()  # more EAGLE rows, one per fixed tree
    # draft sources of the automatic rounds: the first for "eagle", one more row per other
    drafts: tuple[DraftSources, ...] = ("both",)

    def all_methods(self) -> tuple[str, ...]:
        """The methods in run order: EAGLE's rows for other draft sources and for
        ``compare_trees`` follow its own."""
        extra = tuple(drafts_method(d) for d in self.drafts[1:])
        extra += tuple(tree_method(tree) for tree in self.compare_trees)
        if "eagle" not in self.methods:
            return self.methods + extra
        at = self.methods.index("eagle") + 1
        return self.methods[:at] + extra + self.methods[at:]

    def tree_for(self, method: str) -> TreeConfig:
        for tree in self.compare_trees:
            if tree_method(tree) == method:
                return tree
        return self.tree

    def drafts_for(self, method: str) -> DraftSources:
        return next((d for d in self.drafts if drafts_method(d) == method), self.drafts[0])

    def describe_tree(self) -> str:
        tree = self.tree
        return (
            "auto" if tree.auto else f"{tree.total_tokens}/{tree.depth}/{tree.top_k} {tree.shape}"
        )


def run_bench(
    pair: LoadedPair,
    prompts: list[BenchPrompt],
    spec: BenchSpec,
    progress: Callable[[int, int, str], None] | None = None,
    peers: Mapping[str, Peer] | None = None,
) -> BenchResult:
    """Every prompt runs ``spec.repeats`` times per method, methods interleaved; the run with
    the median time per token counts, so a burst of load on a shared machine hits no method
    alone. With sampling the prompt set runs once per seed (seed s, prompt i: seed s*10007+i).
    ``peers`` run the methods of those names (another model, another program)."""
    peers = peers or {}
    costs: CostModel | None = pair.engine.tree_costs()
    encoded = [
        prompt_ids(pair.tokenizer, _conversation(pair, p, spec), prompt_format=pair.prompt_format)
        for p in prompts
    ]
    first = _first_messages(pair, encoded[0], spec)  # before anything else has run
    _warm_up(pair, encoded[0], spec)
    for peer in peers.values():
        peer(encoded[0], GenerationConfig(mode="vanilla", max_new_tokens=8))
    seeds = max(1, spec.seeds) if spec.temperature > 0 else 1
    results: list[PromptResult] = []
    for seed in range(seeds):
        for index, (prompt, ids) in enumerate(zip(prompts, encoded)):
            sampling = SamplingConfig(temperature=spec.temperature, seed=seed * 10007 + index)
            result = PromptResult(prompt, seed=seed)
            step = seed * len(prompts) + index
            report = None if progress is None else partial(progress, step, seeds * len(prompts))
            result.runs = _prompt_runs(pair, ids, spec, sampling, peers, report)
            vanilla = result.runs.get("vanilla")
            if vanilla is not None and vanilla.token_ids:
                reply = vanilla.token_ids
                result.ceiling_rounds = oracle_rounds([*ids, *reply[:1]], reply[1:], LONGEST)
            results.append(result)
    settings = {
        **_pair_settings(pair),
        "temperature": spec.temperature,
        "max_new_tokens": spec.max_new_tokens,
        "tree": spec.describe_tree(),
        "drafts": spec.drafts[0],
        "seeds": seeds,
        "num_prompts": len(prompts),
        "repeats": max(1, spec.repeats),
        "torch": torch.__version__,
        "prompt_tokens_mean": round(sum(map(len, encoded)) / max(1, len(encoded)), 1),
        "prompt_tokens_min": min(map(len, encoded), default=0),
        "peak_rss_bytes": peak_rss_bytes(),
        **first,
    }
    return BenchResult(settings=settings, costs=cost_summary(costs), prompts=results)


def _prompt_runs(
    pair: LoadedPair,
    ids: list[int],
    spec: BenchSpec,
    sampling: SamplingConfig,
    peers: Mapping[str, Peer],
    report: Callable[[str], None] | None,
) -> dict[str, MethodRun]:
    """Each method's median run on one prompt, the methods interleaved repeat by repeat."""
    runs: dict[str, list[MethodRun]] = {method: [] for method in spec.all_methods()}
    for _ in range(max(1, spec.repeats)):
        for method in runs:
            if report is not None:
                report(method)
            config = GenerationConfig(
                mode="eagle" if method.startswith("eagle") else "vanilla",
                sampling=sampling,
                max_new_tokens=spec.max_new_tokens,
                tree=spec.tree_for(method),
                drafts=spec.drafts_for(method),
            )
            runs[method].append(_measured(method, pair, ids, config, peers.get(method)))
    return {method: median_run(done) for method, done in runs.items()}


def _conversation(pair: LoadedPair, prompt: BenchPrompt, spec: BenchSpec) -> list[dict]:
    """The messages up to the prompt's last turn: earlier turns are answered here, once, by
    greedy plain decoding (stopping as a chat does), so every method continues the same
    conversation."""
    messages: list[dict] = []
    for turn in prompt.earlier:
        messages.append({"role": "user", "content": turn})
        ids = prompt_ids(pair.tokenizer, messages, prompt_format=pair.prompt_format)
        config = GenerationConfig(mode="vanilla", max_new_tokens=spec.max_new_tokens)
        finished = [e for e in pair.engine.generate(ids, config) if isinstance(e, Finished)]
        messages.append({"role": "assistant", "content": finished[-1].summary.text})
    return [*messages, {"role": "user", "content": prompt.text}]


def _pair_settings(pair: LoadedPair) -> dict[str, Any]:
    """What the run's numbers depend on from the load: the pair, device, dtype, machine, and
    what the load timed or found kept (calibration, tuner state, projection forms)."""
    return {
        "target": pair.target_path,
        "head": pair.head_path,
        "head_kind": pair.info.head_kind,
        "device": str(pair.engine.runner.device),
        "dtype": pair.info.dtype,
        "machine": machine_description(pair.engine.runner.device),
        "calibration_s": round(pair.calibration_s, 2),
        "tuning_restored": pair.tuning_restored,
        "readout": pair.readout_forms,
        "decoder_forms": pair.decoder_forms,
        "round_threads": pair.round_threads.to_json(),
        "head_precision": pair.info.head_dtype or "target",
    }


def _first_messages(pair: LoadedPair, ids: list[int], spec: BenchSpec) -> dict[str, float]:
    """Tokens/s of the very first EAGLE reply after load and of the same reply right after:
    whatever the first one pays once (tree costs, first calls) shows as the gap. Both run the
    whole token budget past EOS: on a reply of a dozen tokens one round's luck would decide.
    The tuner is left as these found it: text past EOS is no text a user's reply starts on,
    so the measured prompts start from what a load gives (the prior or the saved state)."""
    if "eagle" not in spec.methods:
        return {}
    policies = pair.engine.policies  # the dict itself: it is what is saved at exit
    kept = copy.deepcopy(policies)
    try:
        return _timed_first_messages(pair, ids, spec)
    finally:
        policies.clear()
        policies.update(kept)


def _timed_first_messages(pair: LoadedPair, ids: list[int], spec: BenchSpec) -> dict[str, float]:
    config = GenerationConfig(
        mode="eagle",
        max_new_tokens=spec.max_new_tokens,
        tree=spec.tree,
        stop_on_eos=False,
        drafts=spec.drafts[0],
    )
    speeds = []
    for _ in range(2):
        run = run_engine(pair, ids, config)
        speeds.append(run.new_tokens / run.seconds if run.seconds > 0 else 0.0)
    return {
        "first_message_tok_s": round(speeds[0], 2),
        "second_message_tok_s": round(speeds[1], 2),
        "first_message_tokens": run.new_tokens,
    }


def _warm_up(pair: LoadedPair, ids: list[int], spec: BenchSpec) -> None:
    """Kernel set-up and first-call costs land here, in no method's timings."""
    run_engine(pair, ids, GenerationConfig(mode="vanilla", max_new_tokens=8))
    if "eagle" in spec.methods:
        config = GenerationConfig(
            mode="eagle", max_new_tokens=8, tree=spec.tree, drafts=spec.drafts[0]
        )
        run_engine(pair, ids, config)
    if "generate" in spec.methods:
        run_generate(pair, ids, GenerationConfig(mode="vanilla", max_new_tokens=8))


def _measured(
    method: str, pair: LoadedPair, ids: list[int], config: GenerationConfig, peer: Peer | None
) -> MethodRun:
    """One run of ``method`` (by ``peer`` when given), with the device's peak memory during it
    where the device has a counter for it (CUDA)."""
    device = pair.engine.runner.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    if peer is not None:
        run = peer(ids, config)
    elif method == "prompt_lookup":
        run = run_prompt_lookup(pair, ids, config)
    elif method == "generate":
        run = run_generate(pair, ids, config)
    else:
        run = run_engine(pair, ids, config)
    if device.type == "cuda":
        run = dataclasses.replace(run, peak_memory_bytes=torch.cuda.max_memory_allocated(device))
    return dataclasses.replace(run, method=method)


def peak_rss_bytes() -> int:
    """The process's peak resident memory so far (Linux and macOS report it in different units)."""
    try:
        import resource
    except ImportError:  # not on Windows
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def cost_summary(costs: CostModel | None) -> dict[str, Any]:
    if costs is None:
        return {}
    step = costs.verify(1)
    return {
        "step_s": step,
        "verify_ratio": {str(n): round(costs.verify_ratio(n), 3) for n in sorted(costs.verify_s)},
        "chain_verify_ratio": {
            str(n): round(costs.verify_ratio(n, chain=True), 3) for n in sorted(costs.verify_s)
        },
        "draft_step_ratio": round(costs.draft_step_s / step, 3),
        "chain_step_ratio": round(costs.step_s(chain=True) / step, 3),
    }
