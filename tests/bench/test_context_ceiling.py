"""The bench's ceiling for context drafts (context_ceiling.py): an oracle round writes the
longest continuation of the context the reply follows, plus one token; nothing when nothing
repeats. Checked on hand-made token lists."""

from __future__ import annotations

from backend.bench.context_ceiling import oracle_rounds
from backend.bench.report import summarize, to_markdown
from backend.bench.runner import BenchResult
from tests.bench.test_report import hand_made

PASSAGE = list(range(100, 200))  # 100 distinct tokens


def test_a_reply_copying_the_context_takes_one_round_per_longest_chain_and_token() -> None:
    context = [*PASSAGE, 100, 101]  # ends with the passage's first two tokens
    assert oracle_rounds(context, PASSAGE[2:68], longest=32) == 2  # 66 tokens: 33 a round
    assert oracle_rounds(context, PASSAGE[2:68], longest=10) == 6  # 11 a round


def test_a_reply_that_repeats_nothing_takes_a_round_per_token() -> None:
    assert oracle_rounds(PASSAGE, list(range(500, 540)), longest=32) == 40


def test_the_oracle_takes_the_best_of_several_places_and_follows_a_loop() -> None:
    context = [7, 8, 1, 2, 7, 8, 3, 4, 5, 6, 9, 9]
    assert oracle_rounds([*context, 7, 8], [3, 4, 5, 6], longest=32) == 1  # the second place
    loop = [1, 2, 3, 1, 2, 3]
    assert oracle_rounds(loop, [1, 2, 3] * 10, longest=32) == 1  # a loop runs on in a round


def test_the_report_states_the_ceiling_and_results_keep_it() -> None:
    result = hand_made()  # two prompts, vanilla writes 3 tokens on each
    assert "Ceiling" not in to_markdown(result, summarize(result), "cmd")
    for prompt, rounds in zip(result.prompts, (1, 3)):
        prompt.ceiling_rounds = rounds
    summary = to_markdown(result, summarize(result), "cmd")
    # vanilla wrote 3 and 1 tokens after its first: (3 + 1) / (1 + 3)
    assert "Ceiling of context drafts on vanilla's replies: 1.00 tokens per round" in summary
    again = BenchResult.from_json(result.to_json())
    assert [p.ceiling_rounds for p in again.prompts] == [1, 3]
