"""Plain data objects that leave the backend: generation stream and progress.

Everything here is a frozen dataclass of plain Python values (no tensors, no tokenizer, no UI
types), so the UI, the CLI's ``--json``, the HTTP API and the benchmark can consume or
serialise it directly with :func:`to_dict`.

Definitions used everywhere (the engine's statistics, the API, the benchmark and the app):
- *accepted drafts* of a round: drafted tokens the target agreed with; the bonus token the
  target produced itself after them is not counted. A draft comes from the head or from the
  context (a continuation copied from earlier text); one both proposed counts as the head's.
- *acceptance length* of a round: the tokens it gained, i.e. accepted drafts + 1 (the bonus
  token), fewer only in a round cut short by a stop (EOS, marker, stop string, budget).
- *tau* (average acceptance length): tokens produced by verification rounds / number of rounds
  (``average_acceptance_length``). The first token, produced by the prefill forward, is counted
  in neither, so vanilla decoding has tau exactly 1.
- *acceptance per depth* d: the share of rounds whose acceptance length exceeds d
  (``acceptance_per_depth``), i.e. that accepted at least d drafts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Union

TokenSource = Literal["head", "context", "target"]  # who wrote a token: which drafts, or the target
StopReason = Literal["eos", "max_new_tokens", "context_length", "stop_string", "cancelled"]


def average_acceptance_length(round_tokens: int, rounds: int) -> float:
    """tau: tokens produced by ``rounds`` verification rounds / rounds (0.0 without rounds)."""
    return round_tokens / rounds if rounds else 0.0


def acceptance_per_depth(lengths: Sequence[int]) -> tuple[float, ...]:
    """Per depth d = 1..deepest, the share of rounds that accepted at least d drafts."""
    if not lengths:
        return ()
    deepest = max(lengths) - 1
    return tuple(sum(1 for n in lengths if n > d) / len(lengths) for d in range(1, deepest + 1))


@dataclass(frozen=True, slots=True)
class TextSpan:
    """A piece of reply text and who produced it: an accepted head or context draft, or the
    target itself."""

    text: str
    source: TokenSource


@dataclass(frozen=True, slots=True)
class Started:
    request_id: str
    mode: str
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class RoundCompleted:
    """One verification round (EAGLE) or one decoding step (vanilla, and the prefill token)."""

    request_id: str
    round_index: int  # 0 is the prefill's token
    token_ids: tuple[int, ...]  # new tokens of this round, in order, after stop truncation
    spans: tuple[TextSpan, ...]  # their text, split by source
    num_accepted_drafts: int  # drafted tokens accepted this round (bonus token excluded)
    tree_size: int  # nodes verified this round incl. the root; 1 for vanilla
    draft_s: float
    verify_s: float
    bookkeeping_s: float
    elapsed_s: float  # since the request started
    tree_shape: str = ""  # the shape verified this round ("16/5/4", "chain 6", "plain")
    # False for a chunk streamed by a remote engine: its draft rounds happen on the server and
    # are counted from the engine's metrics (EngineMetrics), not per chunk.
    rounds_known: bool = True
    num_accepted_context: int = 0  # of the accepted drafts, those copied from the context


@dataclass(frozen=True, slots=True)
class GenerationSummary:
    new_tokens: int
    rounds: int  # verification rounds (= target forwards) after the prefill
    tau: float  # average acceptance length, see module docstring
    acceptance_lengths: tuple[int, ...]  # tokens gained per round (accepted drafts + 1)
    accept_per_depth: tuple[float, ...]  # share of rounds that accepted >= d drafts, d=1..
    tokens_per_s: float  # new tokens / total wall time incl. prefill
    ttft_s: float  # time to the first new token
    total_s: float
    draft_s: float  # total time spent drafting
    verify_s: float  # total time in target forwards after the prefill
    stop_reason: StopReason
    text: str
    token_ids: tuple[int, ...]
    hint: str = ""  # plain-words reason when the speedup is likely low
    stopped_by: str = ""  # the turn marker or stop string that ended the reply, if one did
    tree_shapes: tuple[tuple[str, int], ...] = ()  # rounds per verified shape, most used first
    # EAGLE's head over the prompt, run after the first token is out: prompt work, in no round
    prompt_head_s: float = 0.0
    accepted_head: int = 0  # accepted drafts the head proposed
    accepted_context: int = 0  # accepted drafts copied from the context (and not the head's)
    token_sources: tuple[TokenSource, ...] = ()  # who wrote each of token_ids


@dataclass(frozen=True, slots=True)
class Finished:
    request_id: str
    summary: GenerationSummary


@dataclass(frozen=True, slots=True)
class GenerationFailed:
    """Last event of a stream that hit a known (or unknown) error. Never a blank reply."""

    request_id: str
    code: str
    message: str
    hint: str = ""


EngineMetricsStatus = Literal["ok", "no_speculation", "metrics_missing"]


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """A remote engine's speculation during one reply: the change of its /metrics counters
    around the reply (other clients' requests at the same time count too)."""

    request_id: str
    status: EngineMetricsStatus
    message: str  # plain words for the panel, e.g. why there are no numbers
    drafts: int = 0  # draft rounds
    draft_tokens: int = 0
    accepted_tokens: int = 0
    acceptance_rate: float | None = None  # accepted / drafted tokens
    accepted_per_position: tuple[float, ...] = ()  # share of rounds accepting draft d, d=1..


GenerationEvent = Union[Started, RoundCompleted, EngineMetrics, Finished, GenerationFailed]

ProgressStage = Literal["resolve", "download", "load", "quantize", "warmup", "calibrate"]
ProgressUnit = Literal["bytes", "files", "steps"]


@dataclass(frozen=True, slots=True)
class Progress:
    """Progress of a download or load; ``total`` None when unknown."""

    stage: ProgressStage
    done: float
    total: float | None
    unit: ProgressUnit
    message: str = ""


def to_dict(event: Any) -> dict[str, Any]:
    """JSON-ready dict of any event, with its type name under ``"event"``."""
    data = dataclasses.asdict(event)
    data["event"] = type(event).__name__
    return data


@dataclass(frozen=True, slots=True)
class PairInfo:
    """What is loaded, for display."""

    target: str
    head: str | None
    head_kind: str | None  # "eagle1" | "eagle3" | None
    architecture: str
    dtype: str
    device: str
    quantization: str
    parameters: int
    vocab_size: int
    max_context: int
    # How prompts are written for the target: "chat template" (the tokenizer's own), or
    # "plain completion" (a base model: the text is continued as it is).
    prompt_format: str = "chat template"
    remote: str = ""  # URL of the remote engine serving the pair; "" when loaded here
    # The round auto-tuner's starting point: "resumed" (from what earlier runs of this pair
    # learned) or "new" (learning from this session's replies).
    tree_tuning: str = ""
    # The head's dtype when it is not the target's ("bfloat16": timed faster for drafting on this
    # CPU; replies are unchanged, the target verifies every draft), else "".
    head_dtype: str = ""


@dataclass(frozen=True, slots=True)
class Loaded:
    info: PairInfo


@dataclass(frozen=True, slots=True)
class LoadFailed:
    code: str
    message: str
    hint: str = ""


LoadEvent = Union[Progress, Loaded, LoadFailed]

RaceLane = Literal["vanilla", "eagle"]


@dataclass(frozen=True, slots=True)
class RaceUpdate:
    """One event of one lane of an EAGLE-versus-vanilla race."""

    lane: RaceLane
    event: GenerationEvent


@dataclass(frozen=True, slots=True)
class RaceFinished:
    vanilla: GenerationSummary
    eagle: GenerationSummary
    speedup: float  # eagle tokens/s / vanilla tokens/s, measured in this race
    identical: bool  # same token ids
    first_divergence: int | None  # index of the first differing new token, None if identical


RaceEvent = Union[RaceUpdate, RaceFinished, GenerationFailed]


RepoSource = Literal["local", "hub"]


@dataclass(frozen=True, slots=True)
class RepoSize:
    """Download and disk size of one side of a pair (target or head), before any loading."""

    name: str  # the repo id or folder as given
    source: RepoSource  # "local": a folder on disk; "hub": a repo id
    total_bytes: int  # every file a loader needs
    cached_bytes: int  # already on disk (a local folder: all of it)
    gated: bool  # needs an accepted licence and a token
    from_cache: bool  # planned without the Hub (offline, unreachable, or a local folder)


@dataclass(frozen=True, slots=True)
class PairPlan:
    """What loading a pair would cost: bytes to fetch and memory to hold, shown before loading.

    ``memory_bytes`` covers the weights only (target in the chosen dtype/quantization plus
    the unquantized head); activations and the KV cache come on top, about
    ``kv_bytes_per_token`` per token of context.
    """

    target: RepoSize
    head: RepoSize | None
    dtype: str  # resolved: float32 / bfloat16 / float16
    quantization: str  # none / 8bit / 4bit
    device: str  # where a load without device_map would go
    parameters: int  # target parameters
    head_parameters: int
    # how they were counted; "gguf": from a GGUF file's metadata (dequantized when loaded)
    parameters_source: Literal["safetensors", "config", "gguf", "download_size"]
    memory_bytes: int
    kv_bytes_per_token: int  # 0 when the target config is not on disk yet
    bytes_to_download: int
    offline: bool  # Hub offline mode is on
    ready: bool  # everything is on disk: loading needs no download


@dataclass(frozen=True, slots=True)
class Downloaded:
    """Both sides of a pair are on disk; loaders open these folders."""

    target_path: str
    head_path: str | None


@dataclass(frozen=True, slots=True)
class BackendStatus:
    loaded: PairInfo | None
    busy: bool  # a generation, race or load holds the model
    queued: int  # requests waiting for their turn


DownloadEvent = Union[Progress, Downloaded, LoadFailed]


def first_divergence(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    """Index of the first differing item of two token-id sequences (or texts); a length
    difference diverges where the shorter ends. None when identical. The race reports it on
    token ids; the UI points at the first differing character of the two replies."""
    for index, (left, right) in enumerate(zip(a, b)):
        if left != right:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def format_bytes(num: float | None) -> str:
    """A size in decimal units, as the Hub shows them ("?" when unknown)."""
    if num is None:
        return "?"
    for unit in ("B", "kB", "MB", "GB"):
        if abs(num) < 1000:
            return f"{num:.0f} {unit}" if unit == "B" else f"{num:.1f} {unit}"
        num /= 1000
    return f"{num:.1f} TB"
