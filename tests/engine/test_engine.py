"""The Engine owns what every request shares: the tree costs (measured once, lazily for an
engine built by hand) and one tuning policy per greedy/sampled decoding, kept across requests
and shared with its tokens-only view."""

from __future__ import annotations

import dataclasses

import torch

from backend.config import GenerationConfig, SamplingConfig, TreeConfig
from backend.engine.autotune import TreePolicy
from backend.engine.calibration import RoundThreads
from backend.engine.engine import Engine
from backend.engine.stopping import StopSpec
from backend.events import Finished, RoundCompleted
from tests.engine.helpers import make_runner
from tests.factories import easy_llama_pair, tiny_tokenizer

PROMPT = [1, 2, 3, 4]


def summary_of(engine: Engine, config: GenerationConfig):
    events = list(engine.generate(PROMPT, config))
    assert isinstance(events[-1], Finished)
    return events[-1].summary


def test_costs_are_measured_once_and_the_policy_carries_across_requests() -> None:
    runner, drafter = make_runner(*easy_llama_pair())
    engine = Engine(runner, drafter)
    assert engine.costs is None
    summary_of(engine, GenerationConfig(max_new_tokens=24))  # an automatic tree
    costs, policy = engine.costs, engine.policies[False, "both"]
    assert costs is not None and policy.costs is costs
    learned = policy.learned()
    assert learned != TreePolicy(costs, policy.arms).learned()  # the first reply taught it
    summary_of(engine, GenerationConfig(max_new_tokens=24))
    assert engine.costs is costs and engine.policies[False, "both"] is policy
    assert policy.learned() != learned  # the second reply went on from there
    sampled = GenerationConfig(max_new_tokens=8, sampling=SamplingConfig(temperature=1.0, seed=0))
    summary_of(engine, sampled)
    assert engine.policies[True, "both"] is not policy
    assert engine.policies[True, "both"].costs is costs
    summary_of(engine, GenerationConfig(max_new_tokens=8, drafts="head"))
    assert all(arm.context == 0 for arm in engine.policies[False, "head"].arms)


def test_plain_decoding_measures_nothing() -> None:
    runner, drafter = make_runner(*easy_llama_pair())
    engine = Engine(runner, drafter)
    summary = summary_of(engine, GenerationConfig(mode="vanilla", max_new_tokens=6))
    assert summary.rounds == 5 and summary.tau == 1.0
    assert engine.costs is None and not engine.policies


def test_without_a_head_eagle_mode_drafts_from_the_context_alone() -> None:
    """Prompt-lookup mode: no head, the policy's arms draft from the context or not at all."""
    runner, _ = make_runner(*easy_llama_pair())
    engine = Engine(runner, None)
    eagle = summary_of(engine, GenerationConfig(max_new_tokens=40, stop_on_eos=False))
    vanilla = summary_of(engine, GenerationConfig(mode="vanilla", max_new_tokens=40))
    assert eagle.token_ids == vanilla.token_ids and eagle.accepted_head == 0
    assert {arm.head for arm in engine.policies[False, "both"].arms} == {None}
    assert engine.tree_policy(drafts="head") is None  # nothing to draft from


def test_the_tokens_only_view_shares_the_tuning_and_makes_no_text() -> None:
    runner, drafter = make_runner(*easy_llama_pair())
    engine = Engine(runner, drafter, tiny_tokenizer())
    view = engine.tokens_only()
    assert view.policies is engine.policies and view.costs is engine.costs is not None
    config = GenerationConfig(max_new_tokens=24)
    bare = summary_of(view, config)
    assert bare.text == "" and view.tokenizer is None
    marker = bare.token_ids[len(bare.token_ids) // 2]
    with_marker = dataclasses.replace(engine, stops=StopSpec(marker_ids={marker: "M"}))
    assert not with_marker.tokens_only().stops.marker_ids  # the view stops at EOS only
    full = summary_of(with_marker, config)
    assert full.token_ids == bare.token_ids[: bare.token_ids.index(marker)]
    assert full.stopped_by == "M" and full.text


def test_the_first_token_is_out_before_the_heads_pass_over_the_prompt(monkeypatch) -> None:
    """The head's pass is prompt work that the first token need not wait for: it runs once the
    first token's event is out, is timed apart (not in any round) and only for EAGLE."""
    runner, drafter = make_runner(*easy_llama_pair())
    engine = Engine(runner, drafter)
    begun = []
    begin = drafter.begin
    monkeypatch.setattr(drafter, "begin", lambda *args: begun.append(1) or begin(*args))
    fixed = dataclasses.replace(
        GenerationConfig(max_new_tokens=12), tree=TreeConfig(total_tokens=7, depth=6, top_k=1)
    )
    stream = engine.generate(PROMPT, fixed)
    next(stream)  # Started
    first = next(stream)
    assert isinstance(first, RoundCompleted) and first.round_index == 0 and begun == []
    rest = list(stream)
    assert begun == [1] and isinstance(rest[-1], Finished)
    assert rest[-1].summary.prompt_head_s > 0
    vanilla = summary_of(engine, GenerationConfig(mode="vanilla", max_new_tokens=12))
    assert vanilla.prompt_head_s == 0.0 and begun == [1]


def test_rounds_run_on_the_engines_thread_count_and_the_prefill_on_all() -> None:
    """The prompt's prefill keeps every thread; drafted rounds and plain steps run on the
    engine's counts for each; the process gets its own count back after every reply."""
    target, head = easy_llama_pair()
    runner, drafter = make_runner(target, head)
    seen: list[tuple[int, int]] = []  # (tokens in the forward, threads)
    target.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(
            (kwargs["input_ids"].shape[-1], torch.get_num_threads())
        ),
        with_kwargs=True,
    )
    head_threads: list[int] = []
    step = drafter._step  # the head's gathered forward (no module hooks run on it)

    def counted_step(*args):
        head_threads.append(torch.get_num_threads())
        return step(*args)

    drafter._step = counted_step
    previous = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        engine = Engine(runner, drafter, round_threads=RoundThreads(plain=2, drafted=1))
        tree = TreeConfig(total_tokens=8, depth=3, top_k=2)
        for mode in ("eagle", "vanilla"):
            summary = summary_of(engine, GenerationConfig(mode=mode, max_new_tokens=12, tree=tree))
            assert summary.rounds > 1
            assert torch.get_num_threads() == 4
    finally:
        torch.set_num_threads(previous)
    prefills = [threads for tokens, threads in seen if tokens == len(PROMPT)]
    plain = [threads for tokens, threads in seen if tokens == 1]
    drafted = [threads for tokens, threads in seen if tokens not in (1, len(PROMPT))]
    assert prefills == [4, 4] and set(plain) == {2} and set(drafted) == {1}
    assert head_threads and set(head_threads[1:]) == {1}  # [0]: its pass over the prompt
