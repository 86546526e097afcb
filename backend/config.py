"""Settings objects that cross the backend boundary. Each default is defined here only.

All are frozen dataclasses validated in ``__post_init__``: a bad value is a ConfigError with a
message a user can act on, raised before any model work starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, get_args

from backend.errors import ConfigError, InputError

Mode = Literal["eagle", "vanilla"]
# Where an auto-tuned round's drafts may come from: the draft head, the context (continuations
# copied from the prompt and the reply so far), or both in one tree.
DraftSources = Literal["head", "context", "both"]
TreeShape = Literal["dynamic", "static"]
DType = Literal["auto", "float32", "bfloat16", "float16"]
Quantization = Literal["none", "8bit", "4bit"]
# How a chat becomes a prompt: see backend/services/prompting.py.
PromptFormat = Literal["auto", "chat_template", "vicuna_v1.1", "plain"]

DEFAULT_MAX_NEW_TOKENS = 256


@dataclass(frozen=True, slots=True)
class SamplingConfig:
    """How the next token is chosen. temperature 0 means greedy (argmax)."""

    temperature: float = 0.0  # 0 = greedy; 0.7-1.0 typical for chat
    top_p: float = 1.0  # nucleus mass kept, in (0, 1]
    top_k: int = 0  # 0 = no top-k cut
    seed: int | None = None  # fixes the sampling RNG for reproducible runs

    def __post_init__(self) -> None:
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True, slots=True)
class TreeConfig:
    """Shape of the draft tree verified per target forward (EAGLE-2 dynamic or EAGLE-1 static).

    total_tokens counts the root (the last accepted token) plus the drafted nodes, so the
    target verifies ``total_tokens`` positions per round. depth is the longest drafted path,
    top_k the branching per expansion. The static shape uses EAGLE-1's fixed tree and ignores
    total_tokens/top_k.
    """

    total_tokens: int = 16  # nodes verified per round incl. root; GPUs afford larger trees
    depth: int = 5  # draft steps per round
    top_k: int = 4  # children kept per expansion
    shape: TreeShape = "dynamic"
    auto: bool = False  # choose the shape per round from measured costs and acceptance

    def label(self) -> str:
        """Short name of the shape, as the summary, the bench and the UI show it."""
        if self.auto:
            return "auto"
        if self.shape == "static":
            return f"static tree, depth {self.depth}"
        if self.top_k == 1 or self.total_tokens == self.depth + 1:
            return f"chain {min(self.depth, self.total_tokens - 1)}"
        return f"{self.total_tokens}/{self.depth}/{self.top_k}"

    def __post_init__(self) -> None:
        if self.shape not in ("dynamic", "static"):
            raise ConfigError(f"tree shape must be 'dynamic' or 'static', got {self.shape!r}")
        if self.depth < 1:
            raise ConfigError(f"tree depth must be >= 1, got {self.depth}")
        if self.top_k < 1:
            raise ConfigError(f"tree top_k must be >= 1, got {self.top_k}")
        if self.total_tokens < 2:
            raise ConfigError(
                f"tree total_tokens must be >= 2 (the root plus at least one draft), "
                f"got {self.total_tokens}"
            )
        max_nodes = 1 + self.top_k + (self.depth - 1) * self.top_k * self.top_k
        if self.shape == "dynamic" and self.total_tokens > max_nodes:
            raise ConfigError(
                f"tree total_tokens={self.total_tokens} exceeds what depth={self.depth} and "
                f"top_k={self.top_k} can draft ({max_nodes} nodes)",
                hint="raise depth or top_k, or lower total_tokens",
            )


@dataclass(frozen=True, slots=True)
class GenerationConfig:
    """Everything one generation needs besides the prompt."""

    mode: Mode = "eagle"
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    tree: TreeConfig = field(default_factory=lambda: TreeConfig(auto=True))
    stop_on_eos: bool = True  # False: the pair's own stops (EOS, turn markers) are off
    # this request's stop strings, on top of the pair's: the reply ends right before the first
    stop: tuple[str, ...] = ()
    # draft sources of an auto-tuned round (a fixed tree drafts from the head alone); without a
    # head only the context drafts
    drafts: DraftSources = "both"

    def __post_init__(self) -> None:
        if self.mode not in ("eagle", "vanilla"):
            raise ConfigError(f"mode must be 'eagle' or 'vanilla', got {self.mode!r}")
        if self.drafts not in get_args(DraftSources):
            raise ConfigError(f"drafts must be head|context|both, got {self.drafts!r}")
        if not isinstance(self.stop, tuple) or not all(isinstance(s, str) and s for s in self.stop):
            raise InputError(
                f"stop strings must be non-empty texts, got {self.stop!r}",
                hint="leave out empty stop strings",
            )
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise InputError(
                f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}"
            )


@dataclass(frozen=True, slots=True)
class LoadConfig:
    """Which target/head pair to load and how."""

    target: str  # local path or Hub repo id
    head: str | None = None  # local path or Hub repo id; None = vanilla only
    dtype: DType = "auto"  # auto = float32 on CPU, bfloat16 on CUDA
    quantization: Quantization = "none"
    device_map: str | None = None  # accelerate device_map, e.g. "auto"; None = one device
    trust_remote_code: bool = False
    gguf_file: str | None = None  # a .gguf file inside the target folder or Hub repo
    prompt_format: PromptFormat = "auto"  # auto = the chat template if any, else plain text
    # CPU output projections (target readout, head lm_head): "auto" = the fastest form per row
    # count as timed at load, or one form forced (see backend/engine/projection_forms.py)
    readout: str = "auto"
    # the target's decoder projections: "auto" = q/k/v and gate/up as one product each, every
    # shape in the fastest CPU form timed at load (backend/engine/decoder_projections.py);
    # "stock" = the model's own
    decoder_forms: str = "auto"
    # CPU threads for the decoding rounds of a pair with a head: 0 = the fastest count timed at
    # load (backend/engine/calibration.py), N = N threads; the prefill always uses them all
    round_threads: int = 0

    def __post_init__(self) -> None:
        if self.readout not in ("auto", "stock", "rows-first", "onednn", "packed"):
            raise ConfigError(
                f"readout must be auto|stock|rows-first|onednn|packed, got {self.readout!r}"
            )
        if self.decoder_forms not in ("auto", "stock"):
            raise ConfigError(f"decoder forms must be auto|stock, got {self.decoder_forms!r}")
        if not isinstance(self.round_threads, int) or self.round_threads < 0:
            raise ConfigError(
                f"round threads must be 0 (auto) or a positive count, got {self.round_threads!r}"
            )
        if not self.target:
            raise ConfigError("a target model (path or Hub id) is required")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ConfigError(f"dtype must be auto|float32|bfloat16|float16, got {self.dtype!r}")
        if self.quantization not in ("none", "8bit", "4bit"):
            raise ConfigError(f"quantization must be none|8bit|4bit, got {self.quantization!r}")
        if self.prompt_format not in get_args(PromptFormat):
            raise ConfigError(
                f"prompt format must be one of {'|'.join(get_args(PromptFormat))}, "
                f"got {self.prompt_format!r}"
            )
        if self.gguf_file is not None and not self.gguf_file.lower().endswith(".gguf"):
            raise ConfigError(f"gguf_file must name a .gguf file, got {self.gguf_file!r}")
