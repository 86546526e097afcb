"""``python launch.py generate``: one prompt through EAGLE or vanilla decoding.

python launch.py generate --target PATH --head PATH --prompt "Hello" --json
python launch.py generate --pair demo --prompt "Count to ten" --stop "5" --stop "five"
python launch.py generate --pair gemma3-270m --prompt "The printing press" --race --json
"""

from __future__ import annotations

import argparse
import json
import sys

from backend.api import Backend
from backend.config import (
    GenerationConfig,
    LoadConfig,
    SamplingConfig,
    TreeConfig,
)
from backend.engine.device import choose_device
from backend.errors import ConfigError, EagleChatError
from backend.events import Finished, GenerationFailed, RaceFinished, RoundCompleted, to_dict
from backend.frontends.flags import (
    add_flags,
    add_loading_flags,
    add_model_flags,
    add_sampling_flags,
    add_tree_flags,
)
from backend.frontends.pairs import chosen_pair
from backend.services.dtypes import choose_dtype

_TREE = TreeConfig()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_flags(parser)
    parser.add_argument("--prompt", required=True, help="the user message")
    parser.add_argument("--system", help="system prompt")
    parser.add_argument(
        "--mode",
        choices=["eagle", "vanilla"],
        default=None,
        help="default: eagle when a head is given, else vanilla",
    )
    add_sampling_flags(parser)
    add_flags(parser, "max-new-tokens")
    parser.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TEXT",
        help="end the reply right before this text (repeatable)",
    )
    add_tree_flags(parser)
    add_loading_flags(parser)
    parser.add_argument("--raw", action="store_true", help="skip the chat template")
    parser.add_argument(
        "--race",
        action="store_true",
        help="vanilla and EAGLE on the same prompt, as the app's race: speeds and whether the "
        "texts are identical",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object at the end")


def load_config_from(args: argparse.Namespace) -> LoadConfig:
    """A LoadConfig from --pair or --target/--head and the loading flags."""
    target, head, dtype = args.target, args.head, args.dtype
    spec = chosen_pair(args)
    if spec is not None:
        target, head = spec.target, head or spec.head
        dtype = choose_dtype(dtype, choose_device(), preferred=spec.dtype)
    if not target:
        raise ConfigError("no target model", hint="give --pair NAME or --target PATH")
    return LoadConfig(
        target=target,
        head=head,
        dtype=dtype,
        quantization=args.quantize,
        device_map=args.device_map,
        trust_remote_code=args.trust_remote_code,
        gguf_file=args.gguf_file,
    )


def build_configs(args: argparse.Namespace) -> tuple[LoadConfig, GenerationConfig]:
    if args.race and args.raw:
        raise ConfigError("--race uses the pair's prompt format", hint="drop --raw")
    load = load_config_from(args)
    generation = GenerationConfig(
        mode=args.mode or "eagle",  # without a head, EAGLE mode drafts from the context
        max_new_tokens=args.max_new_tokens,
        sampling=SamplingConfig(args.temperature, args.top_p, args.top_k_sampling, args.seed),
        tree=tree_config(args),
        stop=tuple(args.stop),
        drafts=args.drafts,
    )
    return load, generation


def tree_config(args: argparse.Namespace) -> TreeConfig:
    """A fixed tree when any tree flag is given (missing ones take the defaults), else auto."""
    given = [args.total_tokens, args.depth, args.top_k]
    if all(value is None for value in given) and args.tree_shape == _TREE.shape:
        return TreeConfig(auto=True)
    return TreeConfig(
        total_tokens=_TREE.total_tokens if args.total_tokens is None else args.total_tokens,
        depth=_TREE.depth if args.depth is None else args.depth,
        top_k=_TREE.top_k if args.top_k is None else args.top_k,
        shape=args.tree_shape,
    )


def run(args: argparse.Namespace) -> int:
    load, generation = build_configs(args)  # config errors surface before any loading
    backend = Backend()
    info = backend.load_blocking(load).info
    if info.prompt_format == "plain completion" and not args.json:
        print(
            f"note: {info.target} has no chat template: plain completion (the prompt text is "
            "continued as it is)",
            file=sys.stderr,
        )
    elif info.prompt_format != "chat template" and not args.json:
        print(
            f"note: {info.target} has no chat template: prompt format {info.prompt_format}, "
            "as its head was trained",
            file=sys.stderr,
        )
    messages = [{"role": "user", "content": args.prompt}]
    if args.race:
        return _race(backend, messages, generation, args)
    summary = None
    for event in backend.stream(messages, generation, system_prompt=args.system, raw=args.raw):
        if isinstance(event, GenerationFailed):
            raise EagleChatError(event.message, event.hint, event.code)
        if isinstance(event, RoundCompleted) and not args.json:
            sys.stdout.write("".join(span.text for span in event.spans))
            sys.stdout.flush()
        if isinstance(event, Finished):
            summary = event.summary
    assert summary is not None
    if args.json:
        data = to_dict(summary)
        data.pop("event")
        data["mode"] = generation.mode
        print(json.dumps(data))
    else:
        print()
        print(
            f"[{generation.mode}] {summary.new_tokens} tokens, {summary.rounds} rounds, "
            f"tau {summary.tau:.2f}, {summary.tokens_per_s:.1f} tokens/s, "
            f"stop: {summary.stop_reason}",
            file=sys.stderr,
        )
    return 0


def _race(backend: Backend, messages: list, generation: GenerationConfig, args) -> int:
    """The app's race from the command line: both lanes timed by their own compute."""
    finished = None
    for event in backend.race(messages, generation, system_prompt=args.system):
        if isinstance(event, GenerationFailed):
            raise EagleChatError(event.message, event.hint, event.code)
        if isinstance(event, RaceFinished):
            finished = event
    assert finished is not None
    if args.json:
        data = to_dict(finished)
        data.pop("event", None)
        print(json.dumps(data))
        return 0
    print(finished.eagle.text)
    verdict = (
        "identical"
        if finished.identical
        else f"different from new token {finished.first_divergence}"
    )
    print(
        f"[race] vanilla {finished.vanilla.tokens_per_s:.1f} tokens/s, EAGLE "
        f"{finished.eagle.tokens_per_s:.1f} tokens/s ({finished.speedup:.2f}x, tau "
        f"{finished.eagle.tau:.2f}); texts {verdict}",
        file=sys.stderr,
    )
    return 0
