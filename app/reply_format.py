"""Model text -> the Markdown a chat bubble renders, so the bubble shows what the model wrote.

Gradio's chatbot renders Markdown, and raw model text is not Markdown: ``12*2=12 ... 12*2``
turns into italics, an unfenced function loses its indentation, ``<|user|>`` vanishes as an
HTML tag. :func:`reply_markdown` keeps the Markdown a reply really uses (fenced code, headings,
lists, quotes, paired ``**bold**``/``*emphasis*``, inline code, links) and neutralises the rest:

- fenced code passes through as it is (a fence still open while streaming is closed);
- a paragraph with indented lines (two spaces or a tab) that are not list items is code
  written without a fence: from the line before the first indented one (``def f():``) to the
  paragraph's end, it is shown in a fence, indentation intact;
- elsewhere, characters that would start emphasis, strikethrough, HTML or an escape by accident
  are backslash-escaped or written as entities.

The chat history keeps the displayed Markdown; the model is sent the original text, which the
chat tab remembers per displayed reply (:class:`app.session.Session`).
"""

from __future__ import annotations

import re

_FENCE_OPEN = re.compile(r"^ {0,3}(`{3,}|~{3,})")
# Two spaces or a tab: a single leading space is often just how a tokenizer decodes a reply.
_INDENTED = re.compile(r"^(?: {2,}|\t)")
_LIST_ITEM = re.compile(r"^\s*(?:[*+-]|\d{1,9}[.)])\s")
_BLOCK_PREFIX = re.compile(r"^ {0,3}(?:#{1,6}\s|>\s?|(?:[*+-]|\d{1,9}[.)])\s+)")
_CODE_SPAN = re.compile(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)")
_LINK = re.compile(r"\[[^\]\n]+\]\([^)\s]+\)")
# Paired emphasis a writer meant: delimiters hug the text and do not touch a word outside.
_EMPHASIS = re.compile(r"(?<![\w*])(\*\*|\*)(?=[^\s*])(.+?)(?<=[^\s*\\])\1(?![\w*])")
_HTML_START = re.compile(r"<(?=[A-Za-z/!?|])")
_ENTITY = re.compile(r"&(?=#?\w+;)")
_ESCAPABLE_BACKSLASH = re.compile(r"\\(?=[!-/:-@\[-`{-~])")
_RULE_OF_EQUALS = re.compile(r"^ {0,3}=+\s*$")
_LOOSE_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")  # intra-word ones are inert


def reply_markdown(text: str) -> str:
    """Markdown whose rendering shows ``text`` faithfully (see the module docstring)."""
    out: list[str] = []
    prose: list[str] = []
    lines = text.split("\n")
    index = 0
    while index < len(lines):
        opened = _FENCE_OPEN.match(lines[index])
        if opened is None:
            prose.append(lines[index])
            index += 1
            continue
        out.extend(_prose_markdown(prose))
        prose = []
        end = _fence_end(lines, index + 1, opened.group(1))
        out.extend(lines[index:end])
        if end == len(lines):  # still streaming (or never closed): close it for display
            out.append(opened.group(1))
        index = end + 1 if end < len(lines) else end
        if end < len(lines):
            out.append(lines[end])
    out.extend(_prose_markdown(prose))
    return "\n".join(out)


def _fence_end(lines: list[str], start: int, fence: str) -> int:
    """Index of the line closing a fence opened with ``fence``; len(lines) when none does."""
    closing = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}\s*$")
    for index in range(start, len(lines)):
        if closing.match(lines[index]):
            return index
    return len(lines)


def _prose_markdown(lines: list[str]) -> list[str]:
    """Unfenced lines: paragraph by paragraph, code shown fenced, the rest escaped."""
    out: list[str] = []
    paragraph: list[str] = []
    for line in [*lines, ""]:
        if line.strip():
            paragraph.append(line)
            continue
        if paragraph:
            out.extend(_paragraph_markdown(paragraph))
            paragraph = []
        out.append(line)
    out.pop()  # the sentinel
    return out


def _paragraph_markdown(lines: list[str]) -> list[str]:
    start = _code_start(lines)
    if start is None:
        return [_escape_line(line) for line in lines]
    code = lines[start:]
    longest_run = max((len(run) for run in re.findall(r"`+", "\n".join(code))), default=0)
    fence = "`" * max(3, longest_run + 1)
    return [*(_escape_line(line) for line in lines[:start]), fence, *code, fence]


def _code_start(lines: list[str]) -> int | None:
    """Where unfenced code starts in a paragraph: the line before its first indented line
    (two spaces or a tab) that is not a list item; None for a paragraph without one."""
    for index, line in enumerate(lines):
        if _INDENTED.match(line) and not _LIST_ITEM.match(line):
            return max(0, index - 1)
    return None


def _escape_line(line: str) -> str:
    """One prose line: a leading block marker (heading, list, quote) kept, inline code spans
    and links kept, everything else escaped where Markdown or HTML would change it."""
    if _RULE_OF_EQUALS.match(line):  # would turn the line above into a heading
        return "\\" + line.lstrip()
    prefix = _BLOCK_PREFIX.match(line)
    head = prefix.group(0) if prefix else ""
    pieces: list[str] = []
    rest = line[len(head) :]
    position = 0
    for kept in re.finditer(f"{_CODE_SPAN.pattern}|{_LINK.pattern}", rest):
        pieces.append(_escape_text(rest[position : kept.start()]))
        pieces.append(kept.group(0))
        position = kept.end()
    pieces.append(_escape_text(rest[position:]))
    return head + "".join(pieces)


def _escape_text(text: str) -> str:
    """Inline text outside code spans and links; paired emphasis stays emphasis."""
    pieces: list[str] = []
    position = 0
    for emphasis in _EMPHASIS.finditer(text):
        pieces.append(_escape_plain(text[position : emphasis.start()]))
        marker = emphasis.group(1)
        pieces.append(marker + _escape_plain(emphasis.group(2)) + marker)
        position = emphasis.end()
    pieces.append(_escape_plain(text[position:]))
    return "".join(pieces)


def _escape_plain(text: str) -> str:
    """Text that must show as it is: every character Markdown or HTML would act on, escaped."""
    text = _ESCAPABLE_BACKSLASH.sub(r"\\\\", text)
    text = _ENTITY.sub("&amp;", text)
    text = _HTML_START.sub("&lt;", text)
    text = text.replace("`", "\\`").replace("~", "\\~")
    text = _LOOSE_UNDERSCORE.sub(r"\\_", text)
    return text.replace("*", "\\*")
