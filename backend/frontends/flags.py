"""The command-line flags that several commands share, declared once.

Every command that names a pair, loads a target, samples or builds a draft tree takes these
flags from here, so ``--dtype`` or ``--top-k`` means and reads the same in ``generate``,
``serve-api``, ``bench``, ``serve`` and ``train-head``. A command passes its own default where
its job needs another one (``bench`` drafts a fixed tree of depth 5 unless told otherwise).

    add_model_flags(parser)
    add_flags(parser, "temperature", defaults={"max_new_tokens": 128})
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any, get_args

from backend.config import (
    DEFAULT_MAX_NEW_TOKENS,
    DraftSources,
    GenerationConfig,
    SamplingConfig,
    TreeConfig,
)
from backend.services.dtypes import DTYPES

_TREE = TreeConfig()
_SAMPLING = SamplingConfig()

# flag -> argparse keyword arguments; the one declaration of each shared flag
FLAGS: dict[str, dict[str, Any]] = {
    "--pair": {
        "help": "catalog pair name (e.g. demo, gemma3-270m) instead of --target/--head",
    },
    "--target": {
        "help": "target model: local folder, .gguf file, Hub id, or org/name:file.gguf",
    },
    "--gguf-file": {"help": "GGUF file inside the --target folder or Hub repo"},
    "--head": {"help": "EAGLE draft head: local path or Hub id"},
    "--dtype": {
        "choices": ["auto", *DTYPES],
        "default": "auto",
        "help": "auto: float32 on CPUs and bfloat16 on GPUs, or a catalog pair's own dtype "
        "where the device runs it well",
    },
    "--quantize": {
        "choices": ["none", "8bit", "4bit"],
        "default": "none",
        "help": "bitsandbytes quantization of the target",
    },
    "--device-map": {"help": "accelerate device_map, e.g. auto"},
    "--trust-remote-code": {
        "action": "store_true",
        "help": "allow model repos to run their own code (off by default)",
    },
    "--temperature": {
        "type": float,
        "default": _SAMPLING.temperature,
        "help": "0 = greedy",
    },
    "--top-p": {"type": float, "default": _SAMPLING.top_p},
    "--top-k-sampling": {
        "type": int,
        "default": _SAMPLING.top_k,
        "help": "top-k cut of the sampling distribution (0 = off)",
    },
    "--seed": {"type": int, "help": "sampling seed (reproducible sampled replies)"},
    "--max-new-tokens": {"type": int, "default": DEFAULT_MAX_NEW_TOKENS},
    "--total-tokens": {
        "type": int,
        "help": f"tree nodes verified per round, root included (e.g. {_TREE.total_tokens}); "
        "default: chosen automatically from measured costs and acceptance",
    },
    "--depth": {"type": int, "help": f"draft steps per round (e.g. {_TREE.depth})"},
    "--top-k": {"type": int, "help": f"tree branching (e.g. {_TREE.top_k})"},
    "--tree-shape": {"choices": ["dynamic", "static"], "default": _TREE.shape},
    "--readout": {
        "choices": ["auto", "stock", "rows-first", "onednn", "packed"],
        "default": "auto",
        "help": "CPU output projections (target readout, head lm_head): the fastest form per row "
        "count as timed at load (auto) or one forced, for A/B",
    },
    "--decoder-forms": {
        "choices": ["auto", "stock"],
        "default": "auto",
        "help": "the target's decoder projections: q/k/v and gate/up as one product each, every "
        "shape in the fastest CPU form timed at load (auto), or the model's own (stock), for A/B",
    },
    "--round-threads": {
        "type": int,
        "default": 0,
        "help": "CPU threads for the decoding rounds: 0 = the fastest count timed at load "
        "(auto), N = N threads (the prefill always uses them all), for A/B",
    },
    "--drafts": {
        "choices": list(get_args(DraftSources)),
        "default": GenerationConfig().drafts,
        "help": "where an automatic round's drafts come from: the head, the context (text "
        "copied from the prompt and the reply so far) or both in one tree (default)",
    },
}

MODEL_FLAGS = ("pair", "target", "gguf-file", "head")
LOADING_FLAGS = ("dtype", "quantize", "device-map", "trust-remote-code")
SAMPLING_FLAGS = ("temperature", "top-p", "top-k-sampling", "seed")
TREE_FLAGS = ("total-tokens", "depth", "top-k", "tree-shape", "drafts")


def add_flags(
    parser: argparse.ArgumentParser, *names: str, defaults: Mapping[str, Any] | None = None
) -> None:
    """Add the named shared flags (``"top-k"`` for ``--top-k``); ``defaults`` maps a flag's
    destination (``top_k``) to this command's default."""
    defaults = defaults or {}
    for name in names:
        options = dict(FLAGS[f"--{name}"])
        dest = name.replace("-", "_")
        if dest in defaults:
            options["default"] = defaults[dest]
        parser.add_argument(f"--{name}", **options)


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    """--pair, or --target (with --gguf-file) and --head: the pair a command loads."""
    add_flags(parser, *MODEL_FLAGS)


def add_loading_flags(parser: argparse.ArgumentParser) -> None:
    """How the target is loaded: dtype, quantization, device map, remote code."""
    add_flags(parser, *LOADING_FLAGS)


def add_sampling_flags(parser: argparse.ArgumentParser) -> None:
    """Temperature, top-p, the sampling top-k cut and the seed."""
    add_flags(parser, *SAMPLING_FLAGS)


def add_tree_flags(parser: argparse.ArgumentParser) -> None:
    """A fixed draft tree (any of these given), else the automatic one."""
    add_flags(parser, *TREE_FLAGS)
