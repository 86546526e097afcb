"""Flags that several commands share are declared once (backend/frontends/flags.py): every
launch.py command that has one declares it exactly as flags.py does, so it parses the same
everywhere; the few same-named flags that mean something else are listed with the reason."""

from __future__ import annotations

import argparse

import pytest

import launch
from backend.frontends.flags import FLAGS, add_flags

# (command, flag) -> why that command's flag is its own
OWN_MEANING = {
    ("app", "--pair"): "the catalog pair loaded at start; default: the demo pair",
    ("app", "--target"): "the pair loaded at start; default: the demo pair",
    ("app", "--head"): "the head loaded with the app's --target, or instead of --pair's",
    ("app", "--dtype"): "unset means the catalog's dtype for the demo pair",
    ("serve", "--dtype"): "passed to vLLM/SGLang, which name more dtypes; default: the catalog's",
    ("serve", "--depth"): "vLLM's speculative tokens; default: the catalog pair's tree",
    ("serve", "--top-k"): "SGLang's branches; default: the catalog pair's tree",
    ("serve", "--total-tokens"): "SGLang's draft tokens; default: the catalog pair's tree",
    ("download", "--head"): "a Hub repo id to fetch, never a local path",
    ("export-head", "--head"): "the head folder to rewrite; default: the --pair's head",
    ("export-head", "--target"): "a local folder, read for its embedding and layer count",
    ("export-head", "--dtype"): "a cast of the head's weights; no auto",
    ("train-head", "--target"): "a local folder or .gguf file, not a Hub id",
    ("train-head", "--seed"): "the training run's seed (data order, held-out split)",
    ("make-demo-target", "--seed"): "the demo target's training seed",
}
# (command, flag): a default the command's job needs, the rest of the flag shared
OWN_DEFAULT = {("bench", "--max-new-tokens"), ("bench", "--depth"), ("bench", "--top-k")}
SAMPLES = {
    "--pair": "demo",
    "--target": "org/model",
    "--gguf-file": "model.Q4_K_M.gguf",
    "--head": "heads/mine",
    "--dtype": "bfloat16",
    "--quantize": "4bit",
    "--device-map": "auto",
    "--temperature": "0.7",
    "--top-p": "0.9",
    "--top-k-sampling": "20",
    "--seed": "7",
    "--max-new-tokens": "64",
    "--total-tokens": "12",
    "--depth": "4",
    "--top-k": "3",
    "--tree-shape": "static",
    "--readout": "rows-first",
}
NUMERIC = {"--temperature", "--top-p", "--top-k-sampling", "--seed", "--max-new-tokens"}
NUMERIC |= {"--total-tokens", "--depth", "--top-k"}


def commands() -> dict[str, argparse.ArgumentParser]:
    parser = launch.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(subparsers.choices)


def canonical(flag: str) -> argparse.Action:
    parser = argparse.ArgumentParser()
    add_flags(parser, flag.removeprefix("--"))
    return next(a for a in parser._actions if flag in a.option_strings)


def described(action: argparse.Action) -> tuple:
    kind = type(action)
    return (kind, action.dest, action.type, action.choices, action.nargs, action.const) + (
        action.required,
        action.help,
        action.metavar,
    )


def shared_actions() -> list[tuple[str, str, argparse.Action]]:
    found = []
    for name, parser in commands().items():
        for action in parser._actions:
            found += [(name, flag, action) for flag in action.option_strings if flag in FLAGS]
    return found


def test_every_shared_flag_reads_as_declared_in_flags_py() -> None:
    differing = set()
    for command, flag, action in shared_actions():
        expected = canonical(flag)
        same_default = action.default == expected.default or (command, flag) in OWN_DEFAULT
        if described(action) != described(expected) or not same_default:
            differing.add((command, flag))
    assert differing == set(OWN_MEANING), (
        "a flag that differs from flags.py without a listed reason, or a listed reason that no "
        f"longer applies: {differing ^ set(OWN_MEANING)}"
    )


def test_every_command_that_takes_a_target_takes_a_pair() -> None:
    takes = {
        name: {flag for action in parser._actions for flag in action.option_strings}
        for name, parser in commands().items()
    }
    with_target = {name for name, flags in takes.items() if "--target" in flags}
    assert with_target >= {"app", "generate", "bench", "serve", "serve-api", "train-head"}
    assert "export-head" in with_target
    assert {name for name in with_target if "--pair" not in takes[name]} == set()


def test_the_flags_most_commands_take_are_really_shared() -> None:
    users: dict[str, set[str]] = {}
    for command, flag, _ in shared_actions():
        if (command, flag) not in OWN_MEANING:
            users.setdefault(flag, set()).add(command)
    assert {"generate", "serve-api", "bench", "serve", "train-head", "export-head"} <= users[
        "--pair"
    ]
    assert {"generate", "serve-api", "bench", "train-head"} <= users["--dtype"]
    assert {"generate", "bench"} <= users["--temperature"] & users["--depth"]
    assert {"generate", "serve-api", "train-head"} <= users["--gguf-file"]


@pytest.mark.parametrize("flag", sorted(SAMPLES))
def test_a_shared_flag_parses_to_the_same_value_in_every_command(flag: str) -> None:
    values = {}
    for name, parser in commands().items():
        if not any(flag in a.option_strings for a in parser._actions):
            continue
        if (name, flag) in OWN_MEANING:
            continue
        for action in parser._actions:
            action.required = False  # parse this one flag alone
        args, rest = parser.parse_known_args([flag, SAMPLES[flag]])
        assert rest == [], (name, rest)
        values[name] = getattr(args, flag.removeprefix("--").replace("-", "_"))
    assert values, f"no command takes {flag}"
    assert len(set(values.values())) == 1, values
    if flag in NUMERIC:
        assert not isinstance(next(iter(values.values())), str), values


def test_bench_keeps_its_own_defaults_and_generate_the_shared_ones() -> None:
    parsers = commands()
    for action in parsers["generate"]._actions:
        action.required = False
    generate = parsers["generate"].parse_args([])
    bench = parsers["bench"].parse_args([])
    assert (bench.max_new_tokens, bench.depth, bench.top_k) == (128, 5, 4)
    assert generate.depth is None and generate.top_k is None  # unset: the automatic tree
    assert generate.max_new_tokens == canonical("--max-new-tokens").default
