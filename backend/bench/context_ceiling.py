"""How much of a reply drafts from the context could have written at best, so that a low reading
of context acceptance can be told apart from text that does not repeat.

An oracle round verifies every continuation the context index offers (engine/context_drafts.py,
up to the longest chain a round carries) and keeps the longest one the reply follows, plus the
target's own next token. A real round carries one or two of them, so it accepts at most this.
At temperature > 0 the reply's own draws decide: a draft that is a single token is accepted
with the probability the target gives it, which is on average what the draws show.
"""

from __future__ import annotations

from collections.abc import Sequence

from backend.engine.autotune import CONTEXT_OPTIONS
from backend.engine.context_drafts import ContextIndex

LONGEST = max(length for length, _ in CONTEXT_OPTIONS)  # the longest chain a round carries
OFFERED = 64  # continuations an oracle round verifies: far more than a round carries


def oracle_rounds(context: Sequence[int], reply: Sequence[int], longest: int) -> int:
    """Rounds the oracle takes to write ``reply`` after ``context``."""
    index = ContextIndex(context)
    written = rounds = 0
    while written < len(reply):
        ahead = reply[written:]
        accepted = max(
            (_shared(candidate, ahead) for candidate in index.continuations(longest, OFFERED)),
            default=0,
        )
        step = min(accepted + 1, len(ahead))
        index.extend(ahead[:step])
        written += step
        rounds += 1
    return rounds


def _shared(candidate: Sequence[int], ahead: Sequence[int]) -> int:
    """Leading tokens ``candidate`` and ``ahead`` have in common."""
    count = 0
    for drafted, written in zip(candidate, ahead):
        if drafted != written:
            break
        count += 1
    return count
