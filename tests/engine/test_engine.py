"""The Engine owns what every request shares: the tree costs (measured once, lazily for an
engine built by hand) and one tuning policy per greedy/sampled decoding, kept across requests
and shared with its tokens-only view."""

from __future__ import annotations

import dataclasses

from backend.config import GenerationConfig, SamplingConfig
from backend.engine.engine import Engine
from backend.engine.stopping import StopSpec
from backend.events import Finished
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
    costs, policy = engine.costs, engine.policies[False]
    assert costs is not None and policy.costs is costs
    learned = dict(policy.measured)
    assert learned  # the first reply taught the policy
    summary_of(engine, GenerationConfig(max_new_tokens=24))
    assert engine.costs is costs and engine.policies[False] is policy
    assert policy.measured != learned  # the second reply went on from there
    sampled = GenerationConfig(max_new_tokens=8, sampling=SamplingConfig(temperature=1.0, seed=0))
    summary_of(engine, sampled)
    assert engine.policies[True] is not policy and engine.policies[True].costs is costs


def test_plain_decoding_measures_nothing() -> None:
    runner, drafter = make_runner(*easy_llama_pair())
    engine = Engine(runner, drafter)
    summary = summary_of(engine, GenerationConfig(mode="vanilla", max_new_tokens=6))
    assert summary.rounds == 5 and summary.tau == 1.0
    assert engine.costs is None and not engine.policies


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
