"""What drafting and verification cost on this device, timed once at load (and cached on disk by
backend/services/calibration_cache.py): the round auto-tuner's price list, which seeds its
measured round times (autotune.py).

Three kinds of timing, all on one prefilled prompt whose cache is cut back after every forward:
- a target forward over N tokens, as a branching tree (tree mask) and as a chain (causal);
- one head draft step, in a branching tree and in a top-1 chain;
- whole rounds of each candidate shape: drafting, verification, acceptance and the cache gather,
  which a sum of the first two misses (tree bookkeeping grows with width and depth).
Measurements are interleaved (every size once, then every size again, ...) and the fastest of
the repeats kept, so a burst of load elsewhere lifts no single size; a warm-up comes first.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field

import torch

from backend.config import TreeConfig
from backend.engine import kv
from backend.engine.device import cpu_threads, device_sync
from backend.engine.progress import drain
from backend.engine.tree import DraftTree
from backend.engine.verify import greedy_accept

MEASURED_SIZES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 60)
CALIBRATION_CONTEXT = 64  # prompt tokens before the timed forwards
# Rounds are timed again as they run (the tuner's measured seconds), so calibration only seeds
# them: two interleaved passes, the fastest kept.
REPEATS = 2
# The thread choice is final for the pair on this machine: more passes before it is made.
THREADS_REPEATS = 5
# Fewer threads than the process has must make a round at least this much faster to be used.
THREADS_GAIN = 1.05
THREADS_SHAPE = TreeConfig()  # the round timed per thread count: the default fixed tree
# A round at every thread this slow is bound by its arithmetic, not by handing ops to threads:
# fewer threads are not timed.
COMPUTE_BOUND_ROUND_S = 0.1


@dataclass(frozen=True, slots=True)
class CostModel:
    """Seconds per target forward by number of verified tokens (a branching tree, which needs a
    tree mask, and a chain, which is plain causal attention), per head draft step (of a
    branching tree, and of a top-1 chain, which skips the tree bookkeeping), and per whole round
    of the shapes timed as such (by label)."""

    verify_s: dict[int, float]
    draft_step_s: float
    chain_step_s: float = 0.0  # 0 = same as draft_step_s
    chain_verify_s: dict[int, float] = field(default_factory=dict)  # empty = same as verify_s
    rounds_s: dict[str, float] = field(default_factory=dict)  # shape label -> whole round

    def verify(self, size: int, chain: bool = False) -> float:
        table = self.chain_verify_s if chain and self.chain_verify_s else self.verify_s
        sizes = sorted(table)
        for known in sizes:
            if known >= size:
                return table[known]
        return table[sizes[-1]] * size / sizes[-1]

    def round_s(self, tree: TreeConfig | None, context: int = 0, chains: int = 1) -> float:
        """A whole round of ``tree`` (None: a plain step): as timed, else verification plus
        draft steps; with ``chains`` context chains of ``context`` tokens merged in, plus
        verifying those on top of the head's nodes."""
        seconds = self._head_round_s(tree)
        if context:
            size = tree.total_tokens if tree else 1
            chain = chains == 1 and (tree is None or tree.top_k == 1)
            seconds += self.verify(size + context * chains, chain) - self.verify(size, chain)
        return seconds

    def _head_round_s(self, tree: TreeConfig | None) -> float:
        if tree is None:
            return self.verify(1)
        timed = self.rounds_s.get(tree.label())
        if timed is not None:
            return timed
        chain = tree.top_k == 1
        return self.verify(tree.total_tokens, chain) + tree.depth * self.step_s(chain)

    def step_s(self, chain: bool) -> float:
        """One head step, in a top-1 chain or in a branching tree."""
        if chain and self.chain_step_s > 0:
            return self.chain_step_s
        return self.draft_step_s

    def verify_ratio(self, size: int, chain: bool = False) -> float:
        """Cost of verifying ``size`` tokens relative to one plain step."""
        return self.verify(size, chain) / self.verify(1)

    def to_json(self) -> dict:
        return {
            "verify_s": {str(n): s for n, s in self.verify_s.items()},
            "chain_verify_s": {str(n): s for n, s in self.chain_verify_s.items()},
            "draft_step_s": self.draft_step_s,
            "chain_step_s": self.chain_step_s,
            "rounds_s": dict(self.rounds_s),
        }

    @classmethod
    def from_json(cls, data: dict) -> CostModel:
        return cls(
            verify_s={int(n): float(s) for n, s in data["verify_s"].items()},
            chain_verify_s={int(n): float(s) for n, s in data.get("chain_verify_s", {}).items()},
            draft_step_s=float(data["draft_step_s"]),
            chain_step_s=float(data.get("chain_step_s", 0.0)),
            rounds_s={str(k): float(s) for k, s in data.get("rounds_s", {}).items()},
        )


def calibration_steps(
    has_drafter: bool, shapes: Sequence[TreeConfig] = (), repeats: int = REPEATS
) -> int:
    """How many measurements ``calibrate`` reports progress for."""
    per_repeat = 2 * len(MEASURED_SIZES) + ((2 + len(shapes)) if has_drafter else 0)
    return repeats * per_repeat


def calibrate(
    runner,
    drafter,
    shapes: Sequence[TreeConfig] = (),
    context: int = CALIBRATION_CONTEXT,
    repeats: int = REPEATS,
    threads: RoundThreads | None = None,
) -> Generator[int, None, CostModel]:
    """Time target forwards of each candidate width (branching trees and chains), head steps and
    whole rounds of ``shapes`` on this device, yielding the number of measurements done after
    each one. Costs are made non-decreasing in the number of tokens (more never costs less).
    With ``threads``, one-token forwards (plain steps) are timed on the plain count and the rest
    on the drafted one, as the engine runs them."""
    forwards: list[tuple[dict[int, float], int, DraftTree]] = []
    verify_s: dict[int, float] = {}
    chain_verify_s: dict[int, float] = {}
    for size in MEASURED_SIZES:
        forwards += [(verify_s, size, _branching(size)), (chain_verify_s, size, _chain(size))]
    steps = {2: float("inf"), 1: float("inf")}  # top_k -> one head step
    rounds = {shape.label(): float("inf") for shape in shapes}
    done = 0
    threads = threads or RoundThreads()
    with torch.inference_mode(), cpu_threads(threads.drafted):
        prompt, cache, step = _prefilled(runner, context, with_features=drafter is not None)
        for _, _, tree in (forwards[0], forwards[-1]):  # warm-up, untimed
            with cpu_threads(threads.of(drafted=tree.size > 1)):
                _time_verify(runner, cache, tree)
        for _ in range(repeats):
            for table, size, tree in forwards:
                with cpu_threads(threads.of(drafted=size > 1)):
                    seconds = _time_verify(runner, cache, tree)
                table[size] = min(table.get(size, float("inf")), seconds)
                done += 1
                yield done
            if drafter is None:
                continue
            for top_k in steps:
                steps[top_k] = min(steps[top_k], _time_head_step(drafter, prompt, step, top_k))
                done += 1
                yield done
            for shape in shapes:
                seconds = _time_round(runner, drafter, cache, prompt, step, shape)
                rounds[shape.label()] = min(rounds[shape.label()], seconds)
                done += 1
                yield done
    has_steps = drafter is not None
    return CostModel(
        verify_s=_non_decreasing(verify_s),
        chain_verify_s=_non_decreasing(chain_verify_s),
        draft_step_s=steps[2] if has_steps else 0.0,
        chain_step_s=steps[1] if has_steps else 0.0,
        rounds_s=rounds if has_steps else {},
    )


def measure_costs(
    runner,
    drafter,
    shapes: Sequence[TreeConfig] = (),
    context: int = CALIBRATION_CONTEXT,
    repeats: int = REPEATS,
    threads: RoundThreads | None = None,
) -> CostModel:
    """``calibrate`` run to its end (callers that show no progress)."""
    return drain(calibrate(runner, drafter, shapes, context, repeats, threads))


def thread_counts(available: int) -> list[int]:
    """The intra-op thread counts worth timing: one, the powers of two below ``available``,
    and ``available`` itself."""
    counts, count = {available}, 1
    while count < available:
        counts.add(count)
        count *= 2
    return sorted(counts)


@dataclass(frozen=True, slots=True)
class RoundThreads:
    """CPU threads for plain steps (one token) and for drafted rounds (a tree or a chain);
    None leaves the process's own count."""

    plain: int | None = None
    drafted: int | None = None

    def of(self, drafted: bool) -> int | None:
        return self.drafted if drafted else self.plain

    def resolved(self, available: int) -> RoundThreads:
        """Both counts spelled out: an unset one is ``available``, the process's own."""
        return RoundThreads(self.plain or available, self.drafted or available)

    def to_json(self) -> dict:
        return {"plain": self.plain or 0, "drafted": self.drafted or 0}

    @classmethod
    def from_json(cls, data: dict | None) -> RoundThreads | None:
        """None for a record without both counts (an older cache entry)."""
        if not isinstance(data, dict) or not data.get("plain") or not data.get("drafted"):
            return None
        return cls(int(data["plain"]), int(data["drafted"]))


def fastest_round_threads(
    runner,
    drafter,
    shape: TreeConfig = THREADS_SHAPE,
    context: int = CALIBRATION_CONTEXT,
    repeats: int = THREADS_REPEATS,
) -> RoundThreads:
    """How many CPU threads decoding rounds should run on: for plain steps and for whole rounds
    of ``shape``, the count (up to the process's own) at which each is fastest.

    A drafted round multiplies a handful of rows at a time. On a small model every op is so
    short that waking and joining threads for it can cost more than the work they share, so
    fewer threads (often one) are faster, while a plain step, which streams every weight for
    one row, may still gain from a second thread; a large model's rounds need every core. The
    prompt's prefill keeps every thread whatever is chosen here. Counts are timed interleaved
    after an untimed pass, fastest repeat kept; fewer threads win only by ``THREADS_GAIN``, and
    a compute-bound round keeps every thread untimed."""
    available = torch.get_num_threads()
    counts = thread_counts(available)
    everything = RoundThreads(available, available)
    if runner.device.type != "cpu" or len(counts) == 1 or drafter is None:
        return everything
    plain = dict.fromkeys(counts, float("inf"))
    drafted = dict.fromkeys(counts, float("inf"))
    with torch.inference_mode():
        prompt, cache, step = _prefilled(runner, context, with_features=True)

        def round_s(count: int) -> float:
            with cpu_threads(count):
                return _time_round(runner, drafter, cache, prompt, step, shape)

        def plain_s(count: int) -> float:
            with cpu_threads(count):
                return _time_verify(runner, cache, _chain(1))

        if round_s(available) > COMPUTE_BOUND_ROUND_S:
            return everything
        for repeat in range(repeats + 1):
            for count in counts:
                seconds = round_s(count), plain_s(count)
                if repeat > 0:  # the first pass warms every count up
                    drafted[count] = min(drafted[count], seconds[0])
                    plain[count] = min(plain[count], seconds[1])
    return RoundThreads(_fewest_clearly_faster(plain), _fewest_clearly_faster(drafted))


def _fewest_clearly_faster(best: dict[int, float]) -> int:
    """The fastest count, where it beats the most threads by ``THREADS_GAIN``; else the most."""
    most = max(best)
    fastest = min(best, key=lambda count: best[count])
    return fastest if best[fastest] * THREADS_GAIN < best[most] else most


def _prefilled(runner, context: int, with_features: bool):
    """A prompt of ``context`` zeros, a new cache holding it, and its prefill step: where every
    timed forward starts from."""
    prompt = torch.zeros(context, dtype=torch.long)
    cache = runner.new_cache()
    return prompt, cache, runner.prefill(prompt, cache, with_features=with_features)


def _branching(size: int) -> DraftTree:
    """A binary tree of ``size`` nodes: the attention-mask path that top-k trees take."""
    parents = torch.tensor([-1] + [(i - 1) // 2 for i in range(1, size)])
    return DraftTree.from_parents(torch.zeros(size, dtype=torch.long), parents)


def _chain(size: int) -> DraftTree:
    return DraftTree.chain(torch.zeros(size, dtype=torch.long))


def _time_verify(runner, cache, tree: DraftTree) -> float:
    committed = kv.cache_length(cache)
    device_sync(runner.device)
    start = time.perf_counter()
    runner.verify(tree, cache, with_features=True)
    device_sync(runner.device)
    seconds = time.perf_counter() - start
    kv.truncate(cache, committed)
    return seconds


def _time_head_step(drafter, prompt: torch.Tensor, step, top_k: int) -> float:
    """One head step of a 4-level tree of width ``top_k`` (the prompt's features fed first)."""
    tree = TreeConfig(total_tokens=1 + 4 * top_k, depth=4, top_k=top_k)
    drafter.begin(prompt, 0, step.features)
    device_sync(drafter.device)
    start = time.perf_counter()
    drafter.propose(0, tree)
    device_sync(drafter.device)
    return (time.perf_counter() - start) / 4


def _time_round(runner, drafter, cache, prompt: torch.Tensor, step, shape: TreeConfig) -> float:
    """A whole greedy round of ``shape`` as the engine runs it when its drafts hold: draft,
    verify, accept, gather the kept entries of the deepest path, and the head's catch-up over
    that path's tokens, which the engine runs at the start of the next draft (here with a
    one-token draft after it, a small cost that every shape pays alike).

    The path is kept whatever this prompt of zeros accepted: rounds that pay keep one, and in a
    branching tree a path past the first level sits apart from the root's slot, so its entries
    must be gathered in every layer. Timed with what happened to hold here (often nothing, a
    plain cut), trees looked cheaper than their real rounds next to chains, whose kept entries
    are always in place."""
    drafter.begin(prompt, 0, step.features)
    committed = kv.cache_length(cache)
    device_sync(runner.device)
    start = time.perf_counter()
    tree = drafter.propose(0, shape)
    verified = runner.verify(tree, cache, with_features=True)
    greedy_accept(tree, verified.logits)  # the acceptance work of every round
    path = _deepest_path(tree)
    keep = torch.tensor((0,) + path, dtype=torch.long)
    kv.keep_tree_entries(cache, committed, keep)
    tokens = tree.token_ids[list(path)].tolist() + [0]  # the path's drafts and a bonus token
    drafter.commit(tokens, verified.features[keep.tolist()])
    drafter.propose(0, TreeConfig(total_tokens=2, depth=1, top_k=1))  # its catch-up forward
    device_sync(runner.device)
    seconds = time.perf_counter() - start
    kv.truncate(cache, committed)
    return seconds


def _deepest_path(tree: DraftTree) -> tuple[int, ...]:
    """Node indices from the root's child down to the deepest node (the first of equals)."""
    deepest = int(tree.depths.argmax())
    return tuple(tree.ancestors[deepest].nonzero().flatten().tolist()[1:])


def _non_decreasing(costs: dict[int, float]) -> dict[int, float]:
    """More tokens never cost less: smooth out timer noise."""
    running, smooth = 0.0, {}
    for size in sorted(costs):
        running = max(running, costs[size])
        smooth[size] = running
    return smooth
