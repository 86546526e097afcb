"""A few short greedy replies at load that teach the tree auto-tuner what the head accepts, when no
earlier run of the pair left it anything (services/tuning_cache.py).

Without them the first reply after a first launch is the tuner's lesson: its early rounds draft
from a prior acceptance rate (often the wrong shape), and each tree size pays its first-call
costs there. Taught at load, that reply starts where the second one would. The lesson is part
of calibration (its progress shows as such and its time counts as calibration time) and is
bounded by tokens and seconds, so a large model on a slow device is not held up for long; what
it taught is saved at once (and what later replies teach at exit), so later loads skip it.
Its text is not the user's, so what it taught counts as a few rounds only, and a reply that
loops on one token (small models do) teaches nothing: any head predicts a loop.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Generator

from backend.config import GenerationConfig
from backend.engine.engine import Engine
from backend.events import Progress, RoundCompleted
from backend.services.prompting import prompt_ids

LESSONS = (  # short everyday requests, one after another until LESSON_TOKENS are decoded
    "Explain how a bicycle stays upright while it moves.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "What are three good habits for staying healthy? Explain each one.",
    "Describe the water cycle to a ten-year-old.",
)
LESSON_TOKENS = 96  # new tokens in all: enough rounds to settle the first depths' rates
LESSON_S = 15.0  # and at most this long (rounds of a large model on a CPU run seconds each)
LESSON_WEIGHT = 4.0  # what the lesson taught counts as this many rounds of the user's text
REPEAT_SHARE = 0.4  # a lesson reply whose commonest token is more than this share of it and
REPEAT_MIN_TOKENS = 16  # that has at least this many tokens teaches nothing


def teach_tuner(engine: Engine, prompt_format: str) -> Generator[Progress, None, tuple[int, float]]:
    """Run the lessons on ``engine``'s greedy policy; returns (rounds taught, seconds)."""
    if engine.drafter is None or engine.tokenizer is None:
        return 0, 0.0
    policy = engine.tree_policy()
    start, rounds, produced, shown = time.perf_counter(), 0, 0, 0

    def out_of_time() -> bool:
        return time.perf_counter() - start > LESSON_S

    message = "teaching the tree tuner this head's acceptance (once per model and machine)"
    for text in LESSONS:
        ids = prompt_ids(
            engine.tokenizer, [{"role": "user", "content": text}], prompt_format=prompt_format
        )
        before = policy.learned()
        config = GenerationConfig(mode="eagle", max_new_tokens=LESSON_TOKENS - produced)
        events = engine.generate(ids, config, request_id="tuner-lesson")
        reply: list[int] = []
        reply_rounds = 0
        for event in events:
            if not isinstance(event, RoundCompleted) or event.round_index == 0:
                continue
            reply += event.token_ids
            reply_rounds += 1
            shown = max(shown, min(produced + len(reply), LESSON_TOKENS))  # never backwards
            yield Progress("calibrate", shown, LESSON_TOKENS, "steps", message)
            if out_of_time():
                events.close()  # the reply stops here; what its rounds taught stays
                break
        if repetitive(reply):  # any head predicts a loop: it says nothing of this one
            policy.restore(before, with_times=False)  # the machine's times it taught stay
        else:
            rounds += reply_rounds
            produced += len(reply)
        if produced >= LESSON_TOKENS or out_of_time():
            break
    # Its text is not the user's: a starting point that the first real rounds overrule
    # quickly where they disagree.
    policy.discount(LESSON_WEIGHT)
    yield Progress("calibrate", LESSON_TOKENS, LESSON_TOKENS, "steps", message)  # done
    return rounds, time.perf_counter() - start


def repetitive(tokens: list[int]) -> bool:
    """A reply that is mostly one token (a small model looping on "0000..."); a chat reply's
    commonest token is a small share of it."""
    if len(tokens) < REPEAT_MIN_TOKENS:
        return False
    return max(Counter(tokens).values()) > REPEAT_SHARE * len(tokens)
