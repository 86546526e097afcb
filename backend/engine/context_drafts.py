"""Drafts from the context: continuations of the text copied from where its last few tokens
occurred before (the prompt, earlier turns, the reply so far).

They cost no model forward and work for every target, with a head or without one, and they win
where text repeats: code rewritten with one change, quotes from a passage, lists, a model that
loops. The index maps every n-gram (MIN_NGRAM..MAX_NGRAM tokens) to the places it ended; a
lookup tries the longest suffix of the text first and takes the most recent distinct
continuations. A continuation that runs into the end of the text repeats itself: the text since
the match is read as one period of a loop.
"""

from __future__ import annotations

from collections.abc import Sequence

MIN_NGRAM = 2  # shorter suffixes match almost anywhere in a long text
MAX_NGRAM = 4
LOOKBACK = 8  # earlier occurrences of one suffix read per lookup, the most recent first


class ContextIndex:
    """Every token committed so far and where each short n-gram of it ended."""

    def __init__(self, tokens: Sequence[int] = ()) -> None:
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], list[int]] = {}  # n-gram -> positions right after it
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            self.tokens.append(int(token))
            end = len(self.tokens)
            for size in range(MIN_NGRAM, min(MAX_NGRAM, end) + 1):
                self._ends.setdefault(tuple(self.tokens[end - size :]), []).append(end)

    def continuations(self, length: int, count: int) -> list[tuple[int, ...]]:
        """Up to ``count`` distinct continuations of ``length`` tokens of the text, from the
        places its longest suffix occurred before, the most recent first."""
        found: list[tuple[int, ...]] = []
        end = len(self.tokens)
        for size in range(min(MAX_NGRAM, end), MIN_NGRAM - 1, -1):
            earlier = self._ends.get(tuple(self.tokens[end - size :]), [])
            for start in earlier[-LOOKBACK - 1 :][::-1]:
                if start == end:  # the suffix itself
                    continue
                continuation = self._continuation(start, length)
                if continuation not in found:
                    found.append(continuation)
                    if len(found) == count:
                        return found
        return found

    def _continuation(self, start: int, length: int) -> tuple[int, ...]:
        period = len(self.tokens) - start
        return tuple(self.tokens[start + offset % period] for offset in range(length))


def matched_length(candidate: Sequence[int], text: Sequence[int], start: int) -> int | None:
    """How many leading tokens of ``candidate`` the text from ``start`` on repeats; None while
    the text is too short to tell (every token so far matched and more would)."""
    for offset, token in enumerate(candidate):
        if start + offset >= len(text):
            return None
        if text[start + offset] != token:
            return offset
    return len(candidate)
