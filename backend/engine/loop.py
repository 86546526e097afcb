"""One request's decoding: EAGLE-1/2/3 speculative decoding, and plain decoding when no drafter
is given (a one-node tree), behind the same stream of events. ``Engine.generate``
(backend/engine/engine.py) drives it:

    decoding.prefill(prompt_ids)          # the prompt's KV, the first token
    decoding.read_prompt()                # the head's pass over the prompt (EAGLE)
    while decoding.stop_reason is None:
        decoding.round()                  # one round, as a RoundCompleted event

Each round: 1 draft a tree (the head's, with continuations copied from the context merged in),
2 verify it in one target forward, 3 accept a path, 4 stop exactly (EOS, turn markers, stop
strings, budget), 5 compact the KV cache and feed the head and the context, 6 teach the tuner,
7 emit the round.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from backend.config import GenerationConfig, TreeConfig
from backend.engine import kv
from backend.engine.autotune import Arm, TreePolicy
from backend.engine.calibration import CostModel, RoundThreads
from backend.engine.context_drafts import ContextIndex
from backend.engine.device import cpu_threads, now
from backend.engine.drafter import Drafter
from backend.engine.replay import replay_heads
from backend.engine.sampling import make_generator, next_token
from backend.engine.stats import SpecStats, explain
from backend.engine.stopping import ReplyText, StopCheck, StopSpec
from backend.engine.target import TargetRunner
from backend.engine.tree import HEAD, DraftTree
from backend.engine.verify import Acceptance, greedy_accept, sample_accept
from backend.errors import InputError
from backend.events import Finished, RoundCompleted, StopReason, TextSpan, TokenSource


def check_prompt(prompt_ids: list[int], target: TargetRunner) -> None:
    if not prompt_ids:
        raise InputError("the prompt is empty", hint="type a message first")
    limit = target.max_positions
    if limit and len(prompt_ids) >= limit:
        raise InputError(
            f"the prompt has {len(prompt_ids)} tokens but the model's context is {limit}",
            hint="shorten the prompt or clear the chat history",
        )


def stop_check(
    config: GenerationConfig, stops: StopSpec, target: TargetRunner, prompt_tokens: int
) -> StopCheck:
    """The token budget (the asked maximum, or what the context has left) and the stop ids."""
    context_left = (target.max_positions - prompt_tokens) if target.max_positions else None
    budget = min(config.max_new_tokens, context_left) if context_left else config.max_new_tokens
    return StopCheck(
        eos_ids=stops.eos_ids,
        budget=budget,
        budget_reason="max_new_tokens" if budget == config.max_new_tokens else "context_length",
        marker_ids=frozenset(stops.marker_ids),
    )


@dataclass
class Decoding:
    """One request's state: the target and (for EAGLE) the drafter and round policy it uses, the
    stop rules, the reply text, the statistics and the random generator."""

    request_id: str
    target: TargetRunner
    drafter: Drafter | None  # the head's; None: no head drafts
    policy: TreePolicy | None  # None: the config's fixed tree (or plain decoding) every round
    config: GenerationConfig
    stops: StopSpec  # empty when config.stop_on_eos is off
    stop: StopCheck
    reply: ReplyText | None  # None without a tokenizer: no text
    generator: torch.Generator | None = None
    round_threads: RoundThreads = RoundThreads()  # CPU threads per kind of round
    stats: SpecStats = field(default_factory=SpecStats)
    produced: list[int] = field(default_factory=list)
    stop_reason: StopReason | None = None
    stopped_by: str = ""  # the marker or stop string that ended the reply
    cache: Any = None
    root: int = 0  # the last accepted token, not yet in the cache
    start: float = 0.0
    # True after rounds without head drafts: the next draft first runs the head over their
    # tokens, a one-off cost that the calibrated round costs leave out
    head_behind: bool = True
    context: ContextIndex | None = None  # the text so far, when the policy drafts from it
    _unread_prompt: tuple[torch.Tensor, torch.Tensor] | None = None  # for the head, after prefill

    def __post_init__(self) -> None:
        self.generator = make_generator(self.config.sampling.seed)

    # ---- the steps -------------------------------------------------------------------------
    def prefill(self, prompt_ids: list[int]) -> RoundCompleted:
        """The prompt's KV, the first token, and the head's features for the whole prompt."""
        self.start = now(self.target.device)
        self.cache = self.target.new_cache()
        prompt = torch.tensor(prompt_ids, dtype=torch.long)
        with_features = self.drafter is not None
        step = self.target.prefill(prompt, self.cache, with_features=with_features)
        self.root = next_token(step.logits[-1], self.config.sampling, self.generator)
        if self.policy is not None and self.policy.context_request[0]:
            self.context = ContextIndex(prompt_ids)
        tokens, spans = self._take([self.root], ["target"])
        ttft_s = self.stats.ttft_s = now(self.target.device) - self.start
        if self.drafter is not None and self.stop_reason is None:
            self._unread_prompt = (prompt, step.features)
        return RoundCompleted(
            request_id=self.request_id,
            round_index=0,
            token_ids=tuple(tokens),
            spans=spans,
            num_accepted_drafts=0,
            tree_size=1,
            draft_s=0.0,
            verify_s=ttft_s,
            bookkeeping_s=0.0,
            elapsed_s=ttft_s,
        )

    def read_prompt(self) -> None:
        """The head's pass over the prompt, once the first token is out: prompt work (timed
        apart, as ``prompt_head_s``), not part of the first round, where it would grow that
        round's cost with the prompt length."""
        if self._unread_prompt is None:
            return
        start = now(self.target.device)
        prompt, features = self._unread_prompt
        self.drafter.begin(prompt, self.root, features)
        self._unread_prompt = None
        self.head_behind = False
        self.stats.prompt_head_s = now(self.target.device) - start

    def round(self) -> RoundCompleted:
        """One verification round, emitted as its event."""
        self.read_prompt()  # a driver that did not read it after the prefill: here, then
        t0 = now(self.target.device)
        candidates, start = self._context_candidates()  # the context's continuations of it
        if self.policy is not None:
            arm = self.policy.choose(bool(candidates))
        else:
            arm = Arm(self.config.tree if self.drafter is not None else None)
        with cpu_threads(self.round_threads.of(arm.drafts)):
            return self._round(t0, arm, candidates, start)

    def _round(
        self, t0: float, arm: Arm, candidates: list[tuple[int, ...]], start: int
    ) -> RoundCompleted:
        device = self.target.device
        head_tree = self._draft(arm.head)  # 1. the head's tree rooted at the last token, and
        tree = head_tree  # the context's candidates merged in
        if arm.context and candidates:
            tree = head_tree.with_chains([c[: arm.context] for c in candidates[: arm.chains]])
        t1 = now(device)
        committed = kv.cache_length(self.cache)  # 2. verify every node in one forward
        step = self.target.verify(tree, self.cache, with_features=self.drafter is not None)
        t2 = now(device)
        acceptance = self._accept(tree, step.logits)  # 3. the longest agreed path + bonus
        # 4. stop exactly at EOS, a turn marker, a stop string or the token budget
        sources = [_source(tree, node) for node in acceptance.accepted_nodes]
        tokens, spans = self._take(acceptance.token_ids, [*sources, "target"])
        if self.stop_reason is None:  # 5. keep the accepted KV; feed the head (and the context)
            _commit(self.cache, committed, tree.size, acceptance, step.features, self.drafter)
            self.root = acceptance.bonus_token_id
        t3 = now(device)
        if self.policy is not None:  # 6. what every arm would have accepted; this one's time
            self._teach(arm, head_tree, acceptance, candidates, start, now(device) - t0)
        accepted = min(acceptance.num_accepted_drafts, len(tokens))  # after truncation
        label = arm.label() if tree.size > 1 else "plain"
        self.stats.add_round(len(tokens), tree.size, t1 - t0, t2 - t1)
        self.stats.tree_shapes[label] += 1
        return RoundCompleted(  # 7. emit the round
            request_id=self.request_id,
            round_index=self.stats.rounds,
            token_ids=tuple(tokens),
            spans=spans,
            num_accepted_drafts=accepted,
            tree_size=tree.size,
            draft_s=t1 - t0,
            verify_s=t2 - t1,
            bookkeeping_s=t3 - t2,
            elapsed_s=t3 - self.start,
            tree_shape=label,
            num_accepted_context=sources[:accepted].count("context"),
        )

    def finish(self, costs: CostModel | None) -> Finished:
        """The reply's summary; ``costs`` let the slow-speed hint price the verified trees."""
        total = now(self.target.device) - self.start
        if self.policy is not None:  # the context drafts the reply left undecided
            self.policy.settle(self._text(), final=True)
        text = self.reply.text() if self.reply is not None else ""
        hint = explain(self.stats, costs) if self.drafter is not None else ""
        reason = self.stop_reason or "cancelled"
        summary = self.stats.summary(self.produced, text, total, reason, self.stopped_by, hint)
        return Finished(self.request_id, summary)

    # ---- pieces of a round -----------------------------------------------------------------
    def _draft(self, shape: TreeConfig | None) -> DraftTree:
        if self.drafter is None or shape is None:
            return DraftTree.root_only(self.root)
        return self.drafter.propose(self.root, shape, self.config.sampling, self.generator)

    def _context_candidates(self) -> tuple[list[tuple[int, ...]], int]:
        """Continuations of the text (the root included) copied from earlier in it, and where
        they would start: every round looks them up, so the tuner scores them even when the
        round does not carry them."""
        start = len(self._text())
        if self.context is None:
            return [], start
        return self.context.continuations(*self.policy.context_request), start

    def _text(self) -> Sequence[int]:
        """The text so far, as the context index holds it (the prompt first) or the reply
        alone: what decides the drafts of earlier rounds."""
        return self.context.tokens if self.context is not None else self.produced

    def _teach(
        self,
        arm: Arm,
        head_tree: DraftTree,
        acceptance: Acceptance,
        candidates: list[tuple[int, ...]],
        start: int,
        seconds: float,
    ) -> None:
        """Tell the policy what every arm would have accepted this round and how long this one
        took; a round whose head first caught up with rounds it sat out is no lesson on time."""
        head_accepted = sum(node < head_tree.size for node in acceptance.accepted_nodes)
        greedy = self.config.sampling.greedy
        replayed = replay_heads(arm.head, self.policy.heads, head_tree, head_accepted, greedy)
        catch_up = arm.head is not None and self.head_behind
        seconds = None if catch_up else seconds
        self.policy.observe(arm, replayed, candidates, self._text(), start, seconds)
        self.head_behind = arm.head is None

    def _accept(self, tree: DraftTree, logits: torch.Tensor) -> Acceptance:
        if self.config.sampling.greedy:
            return greedy_accept(tree, logits)
        return sample_accept(tree, logits, self.config.sampling, self.generator)

    def _take(
        self, round_tokens: Sequence[int], sources: Sequence[TokenSource]
    ) -> tuple[list[int], tuple[TextSpan, ...]]:
        """One round's tokens (and who wrote each) after exact stopping, and their text spans;
        records why to stop and the marker or stop string that stopped the reply."""
        tokens, reason = self.stop.apply(round_tokens, len(self.produced))
        if reason == "stop_string":  # a turn marker id
            self.stopped_by = self.stops.marker_ids[round_tokens[len(tokens)]]
        spans: tuple[TextSpan, ...] = ()
        if self.reply is not None:
            tokens, spans = self.reply.add(tokens, sources[: len(tokens)])
            if self.reply.matched is not None:
                reason, self.stopped_by = "stop_string", self.reply.matched
        self.stop_reason = reason
        self.produced += tokens
        self.stats.token_sources += sources[: len(tokens)]
        if self.context is not None:
            self.context.extend(tokens)
        return tokens, spans


def _source(tree: DraftTree, node: int) -> TokenSource:
    """Who wrote an accepted draft: the head, when it proposed it (whoever else did too)."""
    return "head" if tree.source_of(node) & HEAD else "context"


@torch.inference_mode()
def _commit(
    cache, committed: int, tree_size: int, acceptance: Acceptance, features, drafter: Drafter | None
) -> None:
    if tree_size > 1:  # a lone root's entry is already where it belongs
        keep = torch.tensor((0,) + acceptance.accepted_nodes, dtype=torch.long)
        kv.keep_tree_entries(cache, committed, keep)
    if drafter is not None:
        rows = (0,) + acceptance.accepted_nodes
        drafter.commit(list(acceptance.token_ids), features[list(rows)])
