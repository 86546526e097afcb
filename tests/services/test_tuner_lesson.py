"""The tuner's lesson at load on a scripted engine: a reply that loops on one token teaches
nothing, and what the lesson taught gives way to the first real rounds."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from backend.config import GenerationConfig, TreeConfig
from backend.engine.autotune import TreePolicy
from backend.engine.calibration import MEASURED_SIZES, CostModel
from backend.engine.progress import drain
from backend.events import RoundCompleted
from backend.services.tuner_lesson import LESSON_WEIGHT, repetitive, teach_tuner
from tests.factories import tiny_tokenizer

COSTS = CostModel({n: 0.005 * (1 + 0.1 * (n - 1)) for n in MEASURED_SIZES}, draft_step_s=0.0005)
CHAIN = TreeConfig(total_tokens=7, depth=6, top_k=1)


@dataclass
class ScriptedEngine:
    """Replies with the scripted token ids, one reply per request, 4 tokens a round, each
    round accepting ``accepted`` drafts of a chain of 6 (as the engine's rounds teach it)."""

    tokenizer: object
    replies: list[list[int]]
    accepted: int = 3
    drafter: object = True
    policy: TreePolicy = field(default_factory=lambda: TreePolicy(COSTS))

    def tree_policy(self, sampled: bool = False) -> TreePolicy:
        return self.policy

    def generate(self, ids, config: GenerationConfig, request_id: str) -> Iterator[RoundCompleted]:
        reply = self.replies.pop(0)[: config.max_new_tokens]
        yield _round(0, reply[:1])
        for index, start in enumerate(range(1, len(reply), 4), start=1):
            self.policy.observe(CHAIN, self.accepted)
            yield _round(index, reply[start : start + 4])


def _round(index: int, tokens: list[int]) -> RoundCompleted:
    return RoundCompleted("lesson", index, tuple(tokens), (), 0, 1, 0.0, 0.0, 0.0, 0.0)


def test_a_reply_that_loops_on_one_token_teaches_the_tuner_nothing(tmp_path) -> None:
    chat = [list(range(40, 80)), list(range(100, 140))]  # varied text
    looping = [[7] * 40, [5, 6] + [0] * 38]  # "0000...": any head predicts it
    engine = ScriptedEngine(tiny_tokenizer(tmp_path), looping + chat, accepted=6)
    rounds, _ = drain(teach_tuner(engine, "auto"))  # type: ignore[arg-type]
    assert rounds == 20  # the two varied replies' rounds (10 each), not the loops'
    assert engine.policy.seen[0] == LESSON_WEIGHT  # discounted at the end
    chat_only = ScriptedEngine(tiny_tokenizer(tmp_path / "a"), chat + [[], []], accepted=6)
    drain(teach_tuner(chat_only, "auto"))  # type: ignore[arg-type]
    assert engine.policy.rates == chat_only.policy.rates  # as if the loops never ran
    only_loops = ScriptedEngine(tiny_tokenizer(tmp_path / "b"), looping * 2)
    rounds, _ = drain(teach_tuner(only_loops, "auto"))  # type: ignore[arg-type]
    assert rounds == 0
    assert only_loops.policy.rates == TreePolicy(COSTS).rates  # still the prior


def test_what_a_lesson_taught_gives_way_to_the_first_real_rounds() -> None:
    """A lesson where every draft held, then real text where only the first does: after a few
    real rounds a discounted lesson's depth-2 rate and chain estimate are well below what the
    lesson taken whole still promises."""
    whole, discounted = TreePolicy(COSTS), TreePolicy(COSTS)
    for policy in (whole, discounted):
        for _ in range(60):
            policy.observe(CHAIN, CHAIN.depth)
    discounted.discount(LESSON_WEIGHT)
    assert discounted.rates == whole.rates and discounted.seen[0] == LESSON_WEIGHT
    for policy in (whole, discounted):
        for _ in range(4):
            policy.observe(CHAIN, 1)  # the first draft holds, the second fails
    assert discounted.rates[1] < 0.62 < 0.7 < whole.rates[1]
    assert discounted.expected_tokens(CHAIN) < 0.8 * whole.expected_tokens(CHAIN)


def test_repetition_is_told_from_chat_text() -> None:
    assert repetitive([3] * 20) and repetitive([1, 2] + [9] * 30)
    assert not repetitive(list(range(30)) + [9] * 5)  # a common token, not a loop
    assert not repetitive([3] * 10)  # too short to tell
