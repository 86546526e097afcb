"""The one generation loop: EAGLE-1/2/3 speculative decoding, and plain decoding when no drafter
is given (a one-node tree), behind the same stream of events.

    for event in generate(target, drafter, prompt_ids, config, pair.stops, tokenizer):
        ...

Each round: 1 draft a tree, 2 verify it in one target forward, 3 accept a path, 4 stop
exactly (EOS, turn markers, stop strings, budget), 5 compact the KV cache and feed the head,
6 emit the round.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Iterable, Iterator, Sequence

import torch

from backend.config import GenerationConfig
from backend.engine import kv
from backend.engine.autotune import CostModel, TreePolicy, measure_costs
from backend.engine.device import now
from backend.engine.drafter import Drafter
from backend.engine.sampling import make_generator, next_token
from backend.engine.stats import SpecStats, explain
from backend.engine.stopping import ReplyText, StopCheck, StopSpec
from backend.engine.target import TargetRunner
from backend.engine.tree import DraftTree
from backend.engine.verify import Acceptance, greedy_accept, sample_accept
from backend.errors import InputError
from backend.events import Finished, GenerationEvent, RoundCompleted, Started, StopReason, TextSpan


def check_prompt(prompt_ids: list[int], target: TargetRunner) -> None:
    if not prompt_ids:
        raise InputError("the prompt is empty", hint="type a message first")
    limit = target.max_positions
    if limit and len(prompt_ids) >= limit:
        raise InputError(
            f"the prompt has {len(prompt_ids)} tokens but the model's context is {limit}",
            hint="shorten the prompt or clear the chat history",
        )


def generate(
    target: TargetRunner,
    drafter: Drafter | None,
    prompt_ids: list[int],
    config: GenerationConfig,
    eos_ids: StopSpec | Iterable[int] = (),
    tokenizer=None,
    cancel: threading.Event | None = None,
    request_id: str | None = None,
    costs: CostModel | None = None,
    policy: TreePolicy | None = None,
) -> Iterator[GenerationEvent]:
    """Stream one generation. Raises InputError before the first event on bad input.

    ``costs`` (measured once per loaded pair) drives the automatic tree choice; it is measured
    here when an automatic tree is asked for and none is given. A ``policy`` kept across
    requests (as the Backend does per loaded pair) starts from what earlier replies taught it.
    ``eos_ids`` is the pair's StopSpec (EOS ids, turn markers, stop strings) or bare EOS ids;
    ``config.stop_on_eos=False`` turns all of them off."""
    check_prompt(prompt_ids, target)
    use_drafter = drafter if config.mode == "eagle" else None
    request_id = request_id or uuid.uuid4().hex[:12]
    context_left = (target.max_positions - len(prompt_ids)) if target.max_positions else None
    budget = min(config.max_new_tokens, context_left) if context_left else config.max_new_tokens
    stops = StopSpec.of(eos_ids) if config.stop_on_eos else StopSpec()
    stop = StopCheck(
        eos_ids=stops.eos_ids,
        budget=budget,
        budget_reason="max_new_tokens" if budget == config.max_new_tokens else "context_length",
        marker_ids=frozenset(stops.marker_ids),
    )
    sampling = config.sampling
    generator = make_generator(sampling.seed)
    reply = ReplyText(tokenizer, stops.strings) if tokenizer is not None else None
    stats = SpecStats()
    device = target.device
    produced: list[int] = []
    if policy is not None:
        costs = policy.costs
    elif use_drafter is not None and config.tree.auto and costs is None:
        costs = measure_costs(target, use_drafter)  # once per call; the Backend caches it
    yield Started(request_id=request_id, mode=config.mode, prompt_tokens=len(prompt_ids))
    start = now(device)

    # Prefill: the prompt's KV, the first token, and the head's features for the whole prompt.
    cache = target.new_cache()
    prompt = torch.tensor(prompt_ids, dtype=torch.long)
    step = target.prefill(prompt, cache, with_features=use_drafter is not None)
    root = next_token(step.logits[-1], sampling, generator)
    tokens, spans, stop_reason, stopped_by = _stop_round(stop, stops, reply, [root], 0, 0)
    produced += tokens
    ttft = now(device) - start
    yield _round_event(request_id, 0, tokens, spans, 0, 1, 0.0, ttft, 0.0, ttft)
    if use_drafter is not None and stop_reason is None:
        use_drafter.begin(prompt, root, step.features)
    if use_drafter is None or not config.tree.auto:
        policy = None
    elif policy is None:
        policy = TreePolicy.for_decoding(costs, sampled=not sampling.greedy)
    if policy is not None:
        policy.begin_request()

    round_index = 0
    while stop_reason is None:
        if cancel is not None and cancel.is_set():
            stop_reason = "cancelled"
            break
        round_index += 1
        t0 = now(device)
        # 1. draft a tree rooted at the last token (a lone root for plain decoding)
        tree_config = config.tree if policy is None else policy.choose()
        if use_drafter is not None and tree_config is not None:
            tree = use_drafter.propose(root, tree_config, sampling, generator)
        else:
            tree = DraftTree.root_only(root)
        t1 = now(device)
        # 2. verify every node in one target forward with tree attention
        committed = kv.cache_length(cache)
        step = target.verify(tree, cache, with_features=use_drafter is not None)
        t2 = now(device)
        # 3. accept the longest path the target agrees with, plus its bonus token
        if sampling.greedy:
            acceptance = greedy_accept(tree, step.logits)
        else:
            acceptance = sample_accept(tree, step.logits, sampling, generator)
        # 4. stop exactly at EOS, a turn marker, a stop string or the token budget
        tokens, spans, stop_reason, stopped_by = _stop_round(
            stop, stops, reply, acceptance.token_ids, len(produced), acceptance.num_accepted_drafts
        )
        produced += tokens
        # 5. keep the root and accepted nodes' KV; feed their true features to the head
        if stop_reason is None:
            _commit(cache, committed, tree.size, acceptance, step.features, use_drafter)
            root = acceptance.bonus_token_id
        t3 = now(device)
        if policy is not None and tree_config is not None:
            policy.observe_verified(tree_config, tree, acceptance)
        if policy is not None:
            policy.observe_time(tree_config if tree.size > 1 else None, now(device) - t0)
        accepted_shown = min(acceptance.num_accepted_drafts, len(tokens))  # after truncation
        stats.add_round(accepted_shown, len(tokens), tree.size, t1 - t0, t2 - t1)
        shape = tree_config.label() if tree_config is not None and tree.size > 1 else "plain"
        stats.tree_shapes[shape] += 1
        # 6. emit the round
        event = _round_event(
            request_id, round_index, tokens, spans, accepted_shown, tree.size,
            t1 - t0, t2 - t1, t3 - t2, t3 - start,
        )  # fmt: skip
        yield dataclasses.replace(event, tree_shape=shape)

    total = now(device) - start
    text = reply.text() if reply is not None else ""
    hint = explain(stats, costs) if use_drafter is not None else ""
    summary = stats.summary(produced, text, total, ttft, stop_reason, hint)
    yield Finished(request_id, dataclasses.replace(summary, stopped_by=stopped_by))


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


def _stop_round(
    stop: StopCheck,
    stops: StopSpec,
    reply: ReplyText | None,
    round_tokens: Sequence[int],
    produced: int,
    num_accepted: int,
) -> tuple[list[int], tuple[TextSpan, ...], StopReason | None, str]:
    """One round's tokens after exact stopping, their text spans, why to stop (if so) and the
    marker or stop string that stopped the reply ("" for EOS or the budget)."""
    tokens, reason = stop.apply(round_tokens, produced)
    stopped_by = stops.marker_ids[round_tokens[len(tokens)]] if reason == "stop_string" else ""
    if reply is None:
        return tokens, (), reason, stopped_by
    tokens, spans = reply.add(tokens, min(num_accepted, len(tokens)))
    if reply.matched is not None:
        return tokens, spans, "stop_string", reply.matched
    return tokens, spans, reason, stopped_by


def _round_event(
    request_id: str,
    round_index: int,
    tokens: list[int],
    spans: tuple[TextSpan, ...],
    num_accepted: int,
    tree_size: int,
    draft_s: float,
    verify_s: float,
    bookkeeping_s: float,
    elapsed_s: float,
) -> RoundCompleted:
    return RoundCompleted(
        request_id=request_id,
        round_index=round_index,
        token_ids=tuple(tokens),
        spans=spans,
        num_accepted_drafts=num_accepted,
        tree_size=tree_size,
        draft_s=draft_s,
        verify_s=verify_s,
        bookkeeping_s=bookkeeping_s,
        elapsed_s=elapsed_s,
    )
