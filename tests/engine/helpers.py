"""Run the engine on tiny models and collect its events."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from backend.config import GenerationConfig
from backend.engine import int8_linear
from backend.engine.autotune import Arm, TreePolicy
from backend.engine.calibration import CostModel
from backend.engine.drafter import EagleDrafter
from backend.engine.engine import Engine
from backend.engine.stopping import StopSpec
from backend.engine.target import TargetRunner
from backend.events import Finished, GenerationSummary, RoundCompleted


def with_weights(model, weights: str):
    """``model`` as loaded with ``weights``: "float32" as built, "int8" swapped to its int8 form
    (backend/engine/int8_linear.py)."""
    if weights == "int8":
        int8_linear.quantize_model(model)
    return model


def make_runner(target, head=None) -> tuple[TargetRunner, EagleDrafter | None]:
    num_layers = target.config.num_hidden_layers
    drafter = EagleDrafter(head, num_layers) if head is not None else None
    runner = TargetRunner(target, drafter.feature_indices if drafter else ())
    return runner, drafter


def run(runner, drafter, prompt, **config) -> tuple[GenerationSummary, list[RoundCompleted]]:
    """One generation on a fresh engine (no tuning carried over from an earlier run)."""
    stops = StopSpec(eos_ids=frozenset(config.pop("eos_ids", ())))
    engine = Engine(runner, drafter, stops=stops, costs=config.pop("costs", None))
    events = list(engine.generate(prompt, GenerationConfig(**config)))
    assert isinstance(events[-1], Finished), events[-1]
    rounds = [e for e in events if isinstance(e, RoundCompleted)]
    return events[-1].summary, rounds


def path_tokens(tree, node: int) -> list[int]:
    """Token ids from the tree's root down to ``node``: what sequential decoding would feed."""
    path, at = [], node
    while at >= 0:
        path.insert(0, int(tree.token_ids[at]))
        at = int(tree.parents[at])
    return path


FLAT_COSTS = CostModel(verify_s={1: 1.0, 60: 1.0}, draft_step_s=0.05, chain_step_s=0.05)


class CyclingPolicy(TreePolicy):
    """The real policy's learning with its choice replaced by the given arms in turn: every
    kind of round (merged trees, context chains alone, plain steps) is sure to run."""

    def __init__(self, arms: Sequence[Arm], costs: CostModel = FLAT_COSTS) -> None:
        super().__init__(costs, [Arm(), *arms])
        self._turns = itertools.cycle(arms)

    def choose(self, candidates: bool = True) -> Arm:
        return next(self._turns)  # a context arm without candidates verifies its head alone


def run_arms(
    runner, drafter, prompt, arms: Sequence[Arm], policy: TreePolicy | None = None, **config
) -> tuple[GenerationSummary, list[RoundCompleted]]:
    """One generation whose rounds take ``arms`` in turn (GenerationConfig's auto tree), or
    whatever ``policy`` (a CyclingPolicy of them) chooses."""
    stops = StopSpec(eos_ids=frozenset(config.pop("eos_ids", ())))
    engine = Engine(runner, drafter, stops=stops, costs=FLAT_COSTS)
    generation = GenerationConfig(**config)
    engine.policies[not generation.sampling.greedy, generation.drafts] = policy or CyclingPolicy(
        arms
    )
    events = list(engine.generate(prompt, generation))
    assert isinstance(events[-1], Finished), events[-1]
    return events[-1].summary, [e for e in events if isinstance(e, RoundCompleted)]
