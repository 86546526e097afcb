"""Every ``python launch.py ...`` command in a code block of README.md or docs/*.md names a
subcommand and flags that exist: each is checked against the parser launch.py builds (nothing
runs). A command written out in full (no ``[options]``, ``a|b`` or PLACEHOLDER) must parse as
it is, and the cheap ones run: ``--help``, ``--dry-run`` and ``generate --pair demo``.

Commands are found in fenced blocks, also inside a ``#`` comment or in parentheses there;
a line ending in ``\\`` and an indented ``[...]`` line after a command continue it."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import launch

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = re.compile(r"\bpython3? launch\.py\b")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*(?:[./:_-][A-Za-z0-9_]+)*$")  # PATH, FILE.jsonl
TOP_LEVEL = {"-v", "--verbose", "-vv", "-vvv", "-h", "--help"}


@dataclass(frozen=True)
class DocCommand:
    where: str  # "docs/serving.md:42"
    text: str  # from "python launch.py" to the end of the command

    @property
    def words(self) -> list[str]:
        return shlex.split(self.text)[2:]  # after "python launch.py"


def code_blocks(markdown: str) -> list[tuple[int, list[str]]]:
    """(line number of the first line, lines) of every fenced code block."""
    blocks, current, start, fence = [], [], 0, None
    for number, line in enumerate(markdown.splitlines(), start=1):
        marker = re.match(r"^\s*(```+|~~~+)", line)
        if fence is None and marker:
            fence, current, start = marker.group(1), [], number + 1
        elif fence is not None and line.strip().startswith(fence):
            blocks.append((start, current))
            fence = None
        elif fence is not None:
            current.append(line)
    return blocks


def logical_lines(lines: list[str]) -> list[tuple[int, str]]:
    """(offset, text) with ``\\`` continuations joined, and an indented line that opens with
    ``[`` joined to a command line before it (usage syntax spread over lines)."""
    joined: list[tuple[int, str]] = []
    for offset, line in enumerate(lines):
        previous = joined[-1][1] if joined else ""
        continues = previous.endswith("\\") or (
            COMMAND.search(previous) and line[:1].isspace() and line.lstrip().startswith("[")
        )
        if continues:
            joined[-1] = (joined[-1][0], previous.removesuffix("\\").rstrip() + " " + line.strip())
        else:
            joined.append((offset, line))
    return joined


def command_text(line: str, start: int) -> str:
    """The command that begins at ``start``: up to a ``#`` comment outside quotes, or up to the
    ``)`` that closes a parenthesis opened before it."""
    quote, depth = "", 0
    for index in range(start, len(line)):
        char = line[index]
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and line[index - 1].isspace():
            return line[start:index].strip()
        elif char == "(":
            depth += 1
        elif char == ")":
            if depth == 0:
                return line[start:index].strip()
            depth -= 1
    return line[start:].strip()


def commands_in(markdown: str, name: str) -> list[DocCommand]:
    found = []
    for first, lines in code_blocks(markdown):
        for offset, line in logical_lines(lines):
            for match in COMMAND.finditer(line):
                text = command_text(line, match.start())
                found.append(DocCommand(f"{name}:{first + offset}", text))
    return found


def doc_commands() -> list[DocCommand]:
    return [
        c for path in DOCS for c in commands_in(path.read_text(), path.relative_to(ROOT).as_posix())
    ]


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = launch.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def subcommand_of(words: list[str]) -> str | None:
    """The subcommand the words run (none, or options first: the app), or None for a word
    that is no subcommand."""
    first = next((w.strip("[]()") for w in words if w.strip("[]()") not in TOP_LEVEL), "-")
    if first.startswith("-"):
        return "app"
    return first if first in launch.SUBCOMMANDS else None


def flags_of(words: list[str]) -> list[str]:
    """Every option named, usage brackets and ``--flag=value`` values stripped."""
    stripped = (w.strip("[]()").split("=")[0] for w in words)
    return [w for w in stripped if re.match(r"^--?[A-Za-z]", w)]


def is_written_out(words: list[str]) -> bool:
    """No usage syntax and no PLACEHOLDER: a command to copy as it is."""
    syntax = any(mark in w for w in words for mark in ("[", "]", "|", "...", "…"))
    return not syntax and not any(PLACEHOLDER.match(w) for w in words)


def problems(command: DocCommand, parsers: dict[str, argparse.ArgumentParser]) -> list[str]:
    """What is wrong with a command: an unknown subcommand or flag; a written-out command that
    the parser refuses (a missing required flag, a bad choice or number)."""
    try:
        words = command.words
    except ValueError as err:  # unbalanced quotes
        return [f"cannot split into words: {err}"]
    name = subcommand_of(words)
    if name is None:
        return [f"unknown subcommand in {command.text!r}"]
    known = {flag for action in parsers[name]._actions for flag in action.option_strings}
    unknown = [flag for flag in flags_of(words) if flag not in known | TOP_LEVEL]
    if unknown:
        return [f"{name} has no {', '.join(unknown)}"]
    if is_written_out(words) and not {"-h", "--help"} & set(words):
        try:
            launch.build_parser().parse_args(launch.with_default_command(words))
        except SystemExit:
            return [f"the parser refuses {command.text!r}"]
    return []


def is_cheap(command: DocCommand) -> bool:
    """Runs in seconds and offline: help, a dry run (a download's only for a bundled pair),
    or a reply from the bundled demo pair."""
    words = command.words
    if not is_written_out(words):
        return False
    name = subcommand_of(words)
    if {"-h", "--help"} & set(words):
        return True
    if "--dry-run" in words:
        return name != "download" or words[words.index("download") + 1] == "demo"
    return name == "generate" and "--pair" in words and words[words.index("--pair") + 1] == "demo"


COMMANDS = doc_commands()
PARSERS = subparsers()


def test_the_docs_have_commands_to_check() -> None:
    readme = [c for c in COMMANDS if c.where.startswith("README.md")]
    assert len(readme) >= 5, readme  # the quick start's commands are found
    assert len(COMMANDS) >= 30  # and the docs' commands
    assert any(is_cheap(c) for c in COMMANDS)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.where)
def test_every_command_in_the_docs_exists(command: DocCommand) -> None:
    assert problems(command, PARSERS) == [], command.where


@pytest.mark.parametrize("command", [c for c in COMMANDS if is_cheap(c)], ids=lambda c: c.where)
def test_the_cheap_commands_in_the_docs_run(command: DocCommand) -> None:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    result = subprocess.run(
        [sys.executable, "launch.py", *command.words],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    assert result.returncode == 0, f"{command.where}: {command.text}\n{result.stderr[-2000:]}"
    assert result.stdout.strip(), command.where


def test_the_checker_finds_wrong_commands() -> None:
    markdown = "\n".join(
        [
            "text python launch.py generate --no-such-flag outside a block",
            "```bash",
            "python launch.py generate --pair demo --prompt 'Hi' --tempreature 1  # typo",
            "# the demo (python launch.py serve --engine vllm --pair demo --dry-run) and more",
            "python launch.py bench --pair demo [--limit N]",
            "    [--prompt-chars C] [--no-such-option]",
            "echo $(python launch.py frobnicate)",
            "python launch.py generate --pair demo \\",
            "    --prompt 'Hi' --mode sideways",
            "python launch.py --port 7861",
            "```",
        ]
    )
    found = commands_in(markdown, "x.md")
    assert [c.where for c in found] == ["x.md:3", "x.md:4", "x.md:5", "x.md:7", "x.md:8", "x.md:10"]
    assert found[1].text == "python launch.py serve --engine vllm --pair demo --dry-run"
    assert [bool(problems(c, PARSERS)) for c in found] == [True, False, True, True, True, False]
    assert "--tempreature" in problems(found[0], PARSERS)[0]
    assert "--no-such-option" in problems(found[2], PARSERS)[0]
    assert "refuses" in problems(found[4], PARSERS)[0]  # a choice that does not exist
    assert "unknown subcommand" in problems(found[3], PARSERS)[0]
    assert [is_cheap(c) for c in found] == [True, True, False, False, True, False]
