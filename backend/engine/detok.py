"""Incremental detokenisation: new token ids in, finished text out, so the UI never touches a
tokenizer. Text is held back while it ends in an incomplete multi-byte character."""

from __future__ import annotations

from collections.abc import Sequence


class IncrementalDetokenizer:
    def __init__(self, tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self._prefix_offset = 0  # start of the window decoded for context
        self._read_offset = 0  # end of the text already returned

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=self.skip_special_tokens)

    def add(self, token_ids: Sequence[int]) -> str:
        """Append tokens; return the newly completed text (may be empty)."""
        self.ids.extend(int(t) for t in token_ids)
        prefix_text = self._decode(self.ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(self.ids[self._prefix_offset :])
        if len(full_text) > len(prefix_text) and not full_text.endswith("\ufffd"):
            self._prefix_offset = self._read_offset
            self._read_offset = len(self.ids)
            return full_text[len(prefix_text) :]
        return ""

    def text(self) -> str:
        return self._decode(self.ids)
