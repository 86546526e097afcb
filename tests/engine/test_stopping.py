"""Replies stop exactly at the chat format's turn markers, stop strings and EOS ids (issue 14.3):
nothing from the stop on is emitted, even when it spans tokens or is accepted mid-round, and the
stream never shows part of a stop string."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from backend.config import GenerationConfig, LoadConfig, SamplingConfig, TreeConfig
from backend.engine.stopping import StopCheck, StopSpec, StopStringFilter
from backend.errors import InputError
from backend.events import Finished, RoundCompleted
from backend.services.loading import load_pair
from backend.services.prompting import prompt_ids, stop_spec, template_stops
from tests.factories import tiny_tokenizer

DEMO = Path(__file__).resolve().parents[2] / "assets" / "demo"


def feed_rounds(strings: tuple[str, ...], rounds: list[list[str]]) -> tuple[str, list[int | None]]:
    stops = StopStringFilter(strings)
    shown, kept = "", []
    for texts in rounds:
        released, count = stops.feed([(text, "target") for text in texts])
        shown += "".join(text for text, _ in released)
        assert not any(s[:1] and s[:1] in shown for s in strings), "part of a stop string shown"
        kept.append(count)
    return shown, kept


def test_stop_string_spanning_tokens_and_rounds_is_never_shown() -> None:
    shown, kept = feed_rounds(
        ("###User:",), [["Hello", " wor"], ["ld", "\n#", "##"], ["Us", "er:", " hi"]]
    )
    assert shown == "Hello world\n"
    assert kept == [None, None, 0]  # the stop began in an earlier round: none of this round's


def test_stop_string_inside_one_round_keeps_the_tokens_before_it() -> None:
    shown, kept = feed_rounds(("###User:",), [["A", "B", "###", "User:", "C"]])
    assert shown == "AB"
    assert kept == [2]


def test_held_text_that_is_no_stop_string_is_released() -> None:
    stops = StopStringFilter(("###User:",))
    released, _ = stops.feed([("ab##", "head")])
    assert "".join(t for t, _ in released) == "ab"
    released, count = stops.feed([("x", "target")])
    assert released == [("##", "head"), ("x", "target")] and count is None


def test_turn_marker_accepted_mid_round_is_cut_with_what_follows() -> None:
    check = StopCheck(eos_ids=frozenset({2}), budget=100, marker_ids=frozenset({7}))
    assert check.apply([5, 6, 7, 8, 2], 0) == ([5, 6], "stop_string")
    assert check.apply([5, 2, 7], 0) == ([5, 2], "eos")  # EOS is kept, as before


def test_demo_template_markers_and_all_eos_ids() -> None:
    tokenizer = AutoTokenizer.from_pretrained(DEMO / "target")
    markers, _ = template_stops(tokenizer)
    for text in ("<|user|>", "<|system|>", "<|eos|>"):
        assert tokenizer.convert_tokens_to_ids(text) in markers
    assert tokenizer.convert_tokens_to_ids("<|assistant|>") not in markers  # its own header

    class Model:  # generation_config.eos_token_id may be a list
        class generation_config:  # noqa: N801
            eos_token_id = [2, 9]

    spec = stop_spec(Model(), tokenizer, "chat_template")
    assert spec.eos_ids == {2, 9}
    assert (
        2 not in spec.marker_ids and tokenizer.convert_tokens_to_ids("<|user|>") in spec.marker_ids
    )


def test_tiny_tokenizer_templates_give_markers_and_text_stop_strings() -> None:
    tokenizer = tiny_tokenizer()
    markers, strings = template_stops(tokenizer)
    assert set(markers.values()) == {"<|end|>", "<|user|>", "<|system|>"} and strings == ()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = (  # ChatML: a reply is closed by <|im_end|>
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    assert set(template_stops(tokenizer)[0].values()) == {"<|im_end|>"}
    tokenizer.chat_template = (
        "{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}### assistant:{% endif %}"
    )
    assert template_stops(tokenizer) == ({}, ("### user:",))


@pytest.fixture(scope="module")
def demo_pair():
    return load_pair(
        LoadConfig(target=str(DEMO / "target"), head=str(DEMO / "head-eagle3"), dtype="float32")
    )


def reply(pair, stops, mode: str = "eagle", temperature: float = 0.0, seed: int | None = None):
    return reply_with(pair, stops, config(mode, temperature, seed))


def config(
    mode: str = "eagle", temperature: float = 0.0, seed: int | None = None, stop=()
) -> GenerationConfig:
    return GenerationConfig(
        mode=mode,
        max_new_tokens=40,
        tree=TreeConfig(total_tokens=12, depth=5, top_k=3),
        sampling=SamplingConfig(temperature=temperature, seed=seed),
        stop=stop,
    )


def reply_with(pair, stops, config: GenerationConfig):
    ids = prompt_ids(pair.tokenizer, [{"role": "user", "content": "Write a Python function."}])
    engine = dataclasses.replace(pair.engine, stops=stops)  # same runner, drafter and costs
    events = list(engine.generate(ids, config))
    rounds = [e for e in events if isinstance(e, RoundCompleted)]
    assert isinstance(events[-1], Finished)
    return events[-1].summary, rounds


def cut_inside_drafts(tokenizer, free, free_rounds) -> tuple[int, int, str]:
    """(round number, tokens before it, stop string) for a stop string that starts at the 2nd
    token of a round of accepted drafts and spans two tokens."""
    before = 0
    for number, r in enumerate(free_rounds):
        ids = list(r.token_ids)
        head = tokenizer.decode(list(free.token_ids[: before + 1]), skip_special_tokens=True)
        stop = tokenizer.decode(ids[1:3], skip_special_tokens=True)
        if (
            r.num_accepted_drafts >= 2
            and len(stop.strip()) > 1
            and free.text.find(stop) == len(head)
        ):
            return number, before, stop
        before += len(ids)
    pytest.fail("no round of accepted drafts to cut inside")


def test_demo_pair_stops_exactly_at_a_stop_string(demo_pair) -> None:
    free, free_rounds = reply(demo_pair, StopSpec())
    text = free.text
    number, before, stop = cut_inside_drafts(demo_pair.tokenizer, free, free_rounds)
    summary, rounds = reply(demo_pair, StopSpec(strings=(stop,)))
    assert summary.text == text[: text.find(stop)]
    assert "".join(span.text for r in rounds for span in r.spans) == summary.text
    assert summary.stop_reason == "stop_string" and summary.stopped_by == stop
    assert len(rounds) == number + 1 and rounds[-1].token_ids == free_rounds[number].token_ids[:1]
    assert list(summary.token_ids) == list(free.token_ids[: before + 1])


def test_a_requests_stop_strings_cut_as_exactly_beside_the_pairs_own(demo_pair) -> None:
    own = demo_pair.engine.stops
    assert own.marker_ids  # the demo chat format's turn markers stay in force
    free, free_rounds = reply(demo_pair, own)
    number, before, stop = cut_inside_drafts(demo_pair.tokenizer, free, free_rounds)
    summary, rounds = reply_with(demo_pair, own, config(stop=("never in this reply", stop)))
    assert summary.text == free.text[: free.text.find(stop)]
    assert "".join(span.text for r in rounds for span in r.spans) == summary.text
    assert summary.stop_reason == "stop_string" and summary.stopped_by == stop
    assert list(summary.token_ids) == list(free.token_ids[: before + 1])
    assert demo_pair.engine.stops is own  # the request's strings are its own


def test_request_stop_strings_join_the_pairs_once_and_need_reply_text(demo_pair) -> None:
    own = StopSpec(eos_ids=frozenset({1}), strings=("</s>",))
    assert own.with_strings(("</s>", "x", "x")).strings == ("</s>", "x")
    assert own.with_strings(()) is own
    ids = prompt_ids(demo_pair.tokenizer, [{"role": "user", "content": "Hi"}])
    with pytest.raises(InputError, match="stop strings need the reply text"):
        next(demo_pair.engine.tokens_only().generate(ids, config(stop=("x",))))
    with pytest.raises(InputError, match="non-empty"):
        config(stop=("",))


def test_demo_pair_stops_before_a_turn_marker_token(demo_pair) -> None:
    plain, _ = reply(demo_pair, StopSpec(), mode="vanilla")
    position = len(plain.token_ids) // 2
    marker = plain.token_ids[position]
    summary, _ = reply(demo_pair, StopSpec(marker_ids={marker: "M"}))
    first = plain.token_ids.index(marker)
    assert list(summary.token_ids) == list(plain.token_ids[:first])
    assert summary.stop_reason == "stop_string" and summary.stopped_by == "M"


def test_loaded_demo_pair_never_emits_an_invented_turn(demo_pair) -> None:
    markers = demo_pair.engine.stops.marker_ids
    assert demo_pair.tokenizer.convert_tokens_to_ids("<|user|>") in markers
    for seed in range(4):
        summary, _ = reply(demo_pair, demo_pair.engine.stops, temperature=1.0, seed=seed)
        assert not set(summary.token_ids) & set(markers)
        assert "<|" not in summary.text
