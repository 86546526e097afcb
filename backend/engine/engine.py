"""The engine of one loaded pair: everything a generation needs besides the request itself.

    engine = Engine(runner, drafter, tokenizer, stops, costs)
    for event in engine.generate(prompt_ids, config):
        ...

It owns the target runner, the drafter, the tokenizer, the stop rules and the round auto-tuner's
state (the measured device costs and one ``TreePolicy`` per kind of decoding: greedy or sampled,
and which draft sources), so every reply through it starts from what earlier replies taught the
tuner.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from backend.config import DraftSources, GenerationConfig
from backend.engine.autotune import HEAD_SHAPES, TreePolicy
from backend.engine.calibration import CostModel, RoundThreads, measure_costs
from backend.engine.drafter import Drafter
from backend.engine.loop import Decoding, check_prompt, stop_check
from backend.engine.stopping import ReplyText, StopSpec
from backend.engine.target import TargetRunner
from backend.errors import InputError
from backend.events import GenerationEvent, Started


@dataclass
class Engine:
    """A target runner and (for EAGLE) its drafter, with what every request shares."""

    runner: TargetRunner
    drafter: Drafter | None = None
    tokenizer: Any = None  # None: no reply text, token ids only
    stops: StopSpec = field(default_factory=StopSpec)  # EOS ids, turn markers, stop strings
    costs: CostModel | None = None  # device costs for round auto-tuning, measured once
    # per (sampled, draft sources): acceptance differs between greedy and sampled decoding
    policies: dict[tuple[bool, DraftSources], TreePolicy] = field(default_factory=dict)
    # CPU threads plain steps and drafted rounds run on, chosen at load (calibration.py)
    round_threads: RoundThreads = RoundThreads()

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return tuple(sorted(self.stops.eos_ids))

    def tree_costs(self) -> CostModel:
        """Costs the round auto-tuner needs: measured at load (loading.py) or from the cache;
        timed here, once, only for an engine built by hand."""
        if self.costs is None:
            shapes = HEAD_SHAPES if self.drafter is not None else ()
            self.costs = measure_costs(
                self.runner, self.drafter, shapes, threads=self.round_threads
            )
        return self.costs

    def tree_policy(
        self, sampled: bool = False, drafts: DraftSources = "both"
    ) -> TreePolicy | None:
        """One auto-tuning policy per engine and kind of decoding, so each reply starts from
        what earlier ones learned; None when there is nothing to draft from."""
        key = (sampled, drafts)
        if key not in self.policies:
            policy = TreePolicy.for_decoding(
                self.tree_costs(), sampled, self.drafter is not None, drafts
            )
            if len(policy.arms) == 1:  # the plain step alone
                return None
            self.policies[key] = policy
        return self.policies[key]

    def tokens_only(self) -> Engine:
        """This engine (same runner, drafter, costs and tuning state) stopping at EOS ids only
        and making no reply text: the benchmark's view, comparable with ``model.generate()``."""
        self.tree_costs()  # measured here so that both views share them
        return dataclasses.replace(self, tokenizer=None, stops=StopSpec(eos_ids=self.stops.eos_ids))

    def generate(
        self,
        prompt_ids: list[int],
        config: GenerationConfig,
        cancel: threading.Event | None = None,
        request_id: str | None = None,
    ) -> Iterator[GenerationEvent]:
        """Stream one generation. Raises InputError before the first event on bad input.
        ``config.stop_on_eos=False`` turns the pair's stop rules off; the budget and the
        request's own stop strings (``config.stop``) still hold."""
        check_prompt(prompt_ids, self.runner)
        decoding = self._decoding(len(prompt_ids), config, request_id or uuid.uuid4().hex[:12])
        yield Started(decoding.request_id, config.mode, len(prompt_ids))
        yield decoding.prefill(prompt_ids)
        decoding.read_prompt()
        while decoding.stop_reason is None:
            if cancel is not None and cancel.is_set():
                decoding.stop_reason = "cancelled"
                break
            yield decoding.round()
        yield decoding.finish(self.costs)

    def _decoding(self, prompt_tokens: int, config: GenerationConfig, request_id: str) -> Decoding:
        speculative = config.mode == "eagle"
        drafter = self.drafter if speculative else None
        policy = None
        if speculative and (config.tree.auto or drafter is None):  # no head: context drafts
            policy = self.tree_policy(not config.sampling.greedy, config.drafts)
        stops = (self.stops if config.stop_on_eos else StopSpec()).with_strings(config.stop)
        if config.stop and self.tokenizer is None:
            raise InputError("stop strings need the reply text, and this engine makes none")
        return Decoding(
            request_id=request_id,
            target=self.runner,
            drafter=drafter,
            policy=policy,
            config=config,
            stops=stops,
            stop=stop_check(config, stops, self.runner, prompt_tokens),
            reply=ReplyText(self.tokenizer, stops.strings) if self.tokenizer is not None else None,
            round_threads=self.round_threads,
        )
