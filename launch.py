"""EagleChat's one entry point.

    python launch.py                      # the app on the bundled demo pair (offline)
    python launch.py generate --target PATH --head PATH --prompt "Hi" [--json]
    python launch.py download PAIR_OR_ID [--dry-run]
    python launch.py make-demo-target     # train the demo target LM from offline text

Each subcommand lives in the module that owns it (``add_arguments`` / ``run``); this file only
dispatches, configures logging and turns known errors into a one-line message and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

# subcommand -> (module, help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "app": ("app.main", "the web app: streaming chat, EAGLE-vs-vanilla race, model manager"),
    "generate": ("backend.frontends.generate_cli", "generate one reply from a prompt"),
    "download": ("backend.frontends.download_cli", "download a target/head pair from the Hub"),
    "bench": ("backend.bench.cli", "benchmark vanilla vs EAGLE vs prompt lookup"),
    "serve": ("backend.frontends.serve_cli", "serve a pair with vLLM or SGLang (EAGLE-3 heads)"),
    "serve-api": ("backend.frontends.openai_server", "serve an OpenAI-compatible API on 127.0.0.1"),
    "train-head": ("backend.frontends.train_cli", "train an EAGLE draft head for a target"),
    "export-head": (
        "backend.frontends.export_cli",
        "rewrite a head for vLLM, SGLang, reference code",
    ),
    "make-demo": ("backend.frontends.demo_cli", "rebuild the bundled demo pair (target + heads)"),
    "make-demo-target": (
        "backend.frontends.demo_target_cli",
        "train the bundled demo target model",
    ),
}


def configure_logging(verbosity: int) -> None:
    level = logging.WARNING - 10 * verbosity
    logging.basicConfig(
        level=max(level, logging.DEBUG), format="%(levelname)s %(name)s: %(message)s"
    )
    for noisy in ("httpx", "bitsandbytes", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    if verbosity == 0:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="launch.py", description="EagleChat")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output")
    subparsers = parser.add_subparsers(dest="command")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:  # e.g. the app without gradio: the rest still runs
            sub = subparsers.add_parser(name, help=f"{help_text} (needs {err.name})")
            sub.set_defaults(missing_module=err.name)
            continue
        module.add_arguments(subparsers.add_parser(name, help=help_text))
    return parser


def with_default_command(argv: list[str]) -> list[str]:
    """No subcommand means the app: ``launch.py --port 7861`` is ``launch.py app --port 7861``."""
    if any(arg in SUBCOMMANDS or arg in ("-h", "--help") for arg in argv):
        return argv
    leading = 0
    while leading < len(argv) and argv[leading] in ("-v", "--verbose", "-vv", "-vvv"):
        leading += 1
    return [*argv[:leading], "app", *argv[leading:]]


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    parser = build_parser()
    args, unknown = parser.parse_known_args(
        with_default_command(sys.argv[1:] if argv is None else argv)
    )
    missing = getattr(args, "missing_module", None)
    if missing:
        print(f"error: {args.command} needs {missing}, which is not installed", file=sys.stderr)
        print("hint: install the project's dependencies: pip install -e .", file=sys.stderr)
        return 2
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    configure_logging(args.verbose)
    module = importlib.import_module(SUBCOMMANDS[args.command][0])
    from backend.errors import EagleChatError

    try:
        return int(module.run(args) or 0)
    except EagleChatError as err:
        print(f"error: {err.message}", file=sys.stderr)
        if err.hint:
            print(f"hint: {err.hint}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
