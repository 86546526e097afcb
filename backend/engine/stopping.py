"""Exact stopping: a round may yield several tokens, so EOS, turn markers, stop strings and the
token budget are applied to each round's tokens and the output is truncated, never overshooting.

Three kinds of stop, collected once per loaded pair (``StopSpec``), to which a request may add
stop strings of its own (``GenerationConfig.stop``, the OpenAI API's ``stop``):
- EOS ids (the tokenizer's and every id of the generation config): the EOS token ends the reply
  and is kept as its last token (it decodes to no text);
- turn-marker ids (special tokens the chat format puts between turns, e.g. ``<|user|>``): the
  reply ends *before* the marker, which is not emitted;
- stop strings (plain-text turn markers): the reply text ends right before the string. Text
  that could be the start of a stop string is held back until it is known not to be one, so the
  stream never shows part of a stop string and then takes it back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from backend.engine.detok import IncrementalDetokenizer
from backend.events import StopReason, TextSpan, TokenSource


@dataclass(frozen=True, slots=True)
class StopSpec:
    """Everything that ends a reply besides the token budget."""

    eos_ids: frozenset[int] = frozenset()
    marker_ids: Mapping[int, str] = field(default_factory=dict)  # id -> marker text
    strings: tuple[str, ...] = ()

    def with_strings(self, extra: Sequence[str]) -> StopSpec:
        """These stops and a request's own stop strings, each string once."""
        added = tuple(s for s in dict.fromkeys(extra) if s not in self.strings)
        return replace(self, strings=self.strings + added) if added else self

    def describe(self) -> str:
        """The markers and strings in words, for logs and the UI."""
        shown = [*self.marker_ids.values(), *self.strings]
        return ", ".join(repr(s) for s in shown) if shown else "none"


@dataclass(frozen=True, slots=True)
class StopCheck:
    eos_ids: frozenset[int]
    budget: int  # new tokens allowed in total
    budget_reason: StopReason = "max_new_tokens"
    marker_ids: frozenset[int] = frozenset()

    def apply(self, tokens: Sequence[int], produced: int) -> tuple[list[int], StopReason | None]:
        """Tokens of this round to emit (``produced`` already emitted) and why to stop, if so.
        A turn marker is cut off with what follows it; an EOS token is kept."""
        kept: list[int] = []
        for token in tokens:
            if produced + len(kept) >= self.budget:
                return kept, self.budget_reason
            if token in self.marker_ids:
                return kept, "stop_string"
            kept.append(token)
            if token in self.eos_ids:
                return kept, "eos"
        if produced + len(kept) >= self.budget:
            return kept, self.budget_reason
        return kept, None


Piece = tuple[str, TokenSource]  # the text one token added to the reply, and who wrote it


class StopStringFilter:
    """Streams reply text with exact truncation before the first stop string.

    ``feed`` takes one round's per-token text pieces and returns the pieces safe to show now and,
    when a stop string is complete, how many of this round's tokens come before it."""

    def __init__(self, strings: Sequence[str]) -> None:
        self.strings = tuple(s for s in strings if s)
        self.held: list[Piece] = []  # text that may be the start of a stop string
        self.matched: str | None = None

    def feed(self, pieces: Sequence[Piece]) -> tuple[list[Piece], int | None]:
        """(pieces to release, number of this round's tokens kept if a stop string matched)."""
        if not self.strings:
            return [p for p in pieces if p[0]], None
        held_chars = sum(len(text) for text, _ in self.held)
        candidates = [*self.held, *pieces]
        text = "".join(t for t, _ in candidates)
        start, matched = _first_match(text, self.strings)
        if matched is not None:
            self.matched, self.held = matched, []
            return _take(candidates, start), _tokens_before(pieces, start - held_chars)
        keep = len(text) - _partial_suffix(text, self.strings)
        released = _take(candidates, keep)
        self.held = _drop(candidates, keep)
        return released, None

    def held_text(self) -> str:
        return "".join(text for text, _ in self.held)


def _first_match(text: str, strings: tuple[str, ...]) -> tuple[int, str | None]:
    found = [(text.find(s), s) for s in strings if s in text]
    return min(found) if found else (len(text), None)


def _partial_suffix(text: str, strings: tuple[str, ...]) -> int:
    """Length of the longest end of ``text`` that is a proper start of some stop string."""
    longest = 0
    for s in strings:
        for size in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:size]):
                longest = size
                break
    return longest


def _take(pieces: Sequence[Piece], chars: int) -> list[Piece]:
    out: list[Piece] = []
    for text, source in pieces:
        if chars <= 0:
            break
        if text:
            out.append((text[:chars], source))
        chars -= len(text)
    return out


def _drop(pieces: Sequence[Piece], chars: int) -> list[Piece]:
    out: list[Piece] = []
    for text, source in pieces:
        if chars < len(text):
            out.append((text[max(chars, 0) :], source))
        chars -= len(text)
    return out


def _tokens_before(pieces: Sequence[Piece], chars: int) -> int:
    """How many leading tokens' text lies entirely within the first ``chars`` characters."""
    end = 0
    for count, (text, _) in enumerate(pieces):
        end += len(text)
        if end > chars:
            return count
    return len(pieces)


class ReplyText:
    """Token ids in, the reply's stream text out (split by who wrote it), cut exactly before a
    stop string: the one place where reply text is made, so the UI never touches a tokenizer."""

    def __init__(self, tokenizer, stop_strings: Sequence[str] = ()) -> None:
        self.detok = IncrementalDetokenizer(tokenizer)
        self.filter = StopStringFilter(stop_strings)
        self.shown = ""

    def add(
        self, tokens: list[int], sources: Sequence[TokenSource]
    ) -> tuple[list[int], tuple[TextSpan, ...]]:
        """This round's tokens and who wrote each -> the tokens kept (all but those from a
        completed stop string on) and the text spans to show now. The text is cut exactly; a
        token in which the stop string begins is dropped from the ids, while its text before
        the stop string is kept."""
        pieces = [(self.detok.add([token]), source) for token, source in zip(tokens, sources)]
        released, kept = self.filter.feed(pieces)  # type: ignore[arg-type]
        spans: list[TextSpan] = []
        for text, source in released:
            if spans and spans[-1].source == source:
                spans[-1] = TextSpan(spans[-1].text + text, source)
            else:
                spans.append(TextSpan(text, source))
        self.shown += "".join(text for text, _ in released)
        return (tokens if kept is None else tokens[:kept]), tuple(spans)

    @property
    def matched(self) -> str | None:
        """The stop string that ended the reply, if one did."""
        return self.filter.matched

    def text(self) -> str:
        """The whole reply: what was shown, plus held-back text when no stop string came."""
        return self.shown if self.matched is not None else self.detok.text()
