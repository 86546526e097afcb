"""What a pair needs before it loads: its files on disk (fetching what is missing, with
progress events), the bytes still to download, and the memory its weights will take.

Parameter counts come, best first, from the safetensors headers on disk (exact, a few kB read
per file), from ``config.json`` (Llama-style formula, MoE aware), or from the download size
(assuming 16-bit checkpoints, as nearly all Hub LLMs are). ``PairPlan.parameters_source`` says
which one was used.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from backend.config import LoadConfig
from backend.engine.device import choose_device
from backend.errors import HubError, ResourceError
from backend.events import PairPlan, Progress, RepoSize, format_bytes
from backend.services import hub
from backend.services.dtypes import resolve_dtype
from backend.services.hub_mode import offline_env
from backend.services.hub_progress import ProgressCallback
from backend.services.target_source import is_gguf_path, local_source, locate
from backend.services.validate import read_target_config, text_config
from models.checkpoints import check_safetensors

logger = logging.getLogger(__name__)

DTYPE_BYTES = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2}
# bytes per quantized Linear weight: int8 + row scales; nf4 + one fp32 absmax per 64 weights;
# our int8 (engine/int8_linear.py): the int8 values and the kernel's packed copy of them
QUANT_BYTES = {"8bit": 1.0, "4bit": 0.5 + 4 / 64, "int8": 2.0}
INT8_READOUT_BYTES = 1.0  # int8 also packs the readout (beside its float weight, tied or not)
CHECKPOINT_BYTES_PER_PARAM = 2  # Hub checkpoints are nearly all bf16/fp16
_UNQUANTIZED = ("embed", "lm_head", "wte", "norm")  # bitsandbytes leaves these in float
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf")
_POLL_S = 0.1


@dataclass(frozen=True, slots=True)
class _Side:
    """One repo of a pair as found on disk or planned on the Hub."""

    size: RepoSize
    folder: Path | None  # where its files are (or will be)
    complete: bool  # every needed file is on disk
    weight_bytes: int


def plan_pair(config: LoadConfig) -> PairPlan:
    """Sizes and memory of ``config``'s pair; raises typed Hub errors (nothing is downloaded)."""
    device = choose_device()
    dtype = resolve_dtype(config.dtype, device)
    target = _side(config.target, "target", config.gguf_file)
    head = _side(config.head, "head") if config.head else None
    params, quantizable, source, target_config = _count_target(target, config)
    head_params = _count_head(head) if head else 0
    memory = weight_memory_bytes(params, quantizable, dtype, config.quantization)
    memory += int8_readout_bytes(target_config, config.quantization)
    sides = [side for side in (target, head) if side is not None]
    missing = sum(side.size.total_bytes - side.size.cached_bytes for side in sides)
    return PairPlan(
        target=target.size,
        head=head.size if head else None,
        dtype=str(dtype).removeprefix("torch."),
        quantization=config.quantization,
        device=config.device_map or str(device),
        parameters=params,
        head_parameters=head_params,
        parameters_source=source,
        memory_bytes=memory + head_params * DTYPE_BYTES[dtype],
        kv_bytes_per_token=kv_bytes_per_token(target_config, dtype) if target_config else 0,
        bytes_to_download=missing,
        offline=_offline(),
        ready=all(side.complete for side in sides),
    )


def local_weight_bytes(config: LoadConfig, target_path: str, head_path: str | None) -> int:
    """Memory estimate for a pair already on disk (what ``load`` shows and checks)."""
    dtype = resolve_dtype(config.dtype, choose_device())
    target = _local_side(target_path, config.target)
    params, quantizable, _, target_config = _count_target(target, config)
    head = _count_head(_local_side(head_path, config.head or "")) if head_path else 0
    return (
        weight_memory_bytes(params, quantizable, dtype, config.quantization)
        + int8_readout_bytes(target_config, config.quantization)
        + head * (DTYPE_BYTES[dtype])
    )


def fetch(
    name: str, kind: hub.RepoKind, cancel: threading.Event | None, gguf_file: str | None = None
) -> Generator[Progress, None, str]:
    """The folder holding ``name``'s files (or, for a GGUF target, that file's path): a local
    folder or file as is, a complete cached snapshot without any network, else a download
    (Progress events) into the HF cache."""
    name, gguf_file, local = locate(name, gguf_file)
    if local is not None:
        return local
    try:
        cached = hub.resolve_local(name, gguf_file=gguf_file)
        if _has_weights(Path(cached), gguf_file):
            return local_source(cached, gguf_file).display
    except HubError as err:
        if err.code != "not_cached":
            raise
    plan = hub.plan_download(name, kind, gguf_file=gguf_file)
    hub.check_disk_space(plan)
    folder = yield from _with_progress(
        lambda report, stop: hub.download(plan, report, stop), cancel
    )
    return local_source(folder, gguf_file).display


def _with_progress(
    work: Callable[[ProgressCallback, threading.Event], str], cancel: threading.Event | None
) -> Generator[Progress, None, str]:
    """Run a callback-reporting download in a thread and re-yield its events live; closing the
    generator or setting ``cancel`` stops the download at its next chunk."""
    events: queue.Queue[Progress | None] = queue.Queue()
    stop = threading.Event()
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["path"] = work(events.put, stop)
        except Exception as err:  # handed to the consuming thread, which re-raises it
            outcome["error"] = err
        finally:
            events.put(None)

    worker = threading.Thread(target=run, name="eaglechat-download", daemon=True)
    worker.start()
    try:
        while True:
            if cancel is not None and cancel.is_set():
                stop.set()
            try:
                event = events.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if event is None:
                break
            yield event
    finally:
        stop.set()  # a no-op once the work has finished
    if "error" in outcome:
        raise outcome["error"]
    return outcome["path"]


def _side(name: str, kind: hub.RepoKind, gguf_file: str | None = None) -> _Side:
    name, gguf_file, local = locate(name, gguf_file)
    if local is not None:
        return _local_side(local, name)
    plan = hub.plan_download(name, kind, gguf_file=gguf_file)
    weights = sum(f.size for f in plan.files if f.filename.endswith(_WEIGHT_SUFFIXES))
    size = RepoSize(name, "hub", plan.total_bytes, plan.cached_bytes, plan.gated, plan.from_cache)
    folder = Path(plan.local_path)
    return _Side(
        size, folder / gguf_file if gguf_file else folder, plan.bytes_to_download == 0, weights
    )


def _local_side(folder: str, name: str) -> _Side:
    """A local folder, or a single .gguf file (then ``folder`` is that file)."""
    if is_gguf_path(folder):
        size = Path(folder).stat().st_size
        return _Side(RepoSize(name, "local", size, size, False, True), Path(folder), True, size)
    files = [p for p in Path(folder).rglob("*") if p.is_file()]
    total = sum(p.stat().st_size for p in files)
    weights = sum(p.stat().st_size for p in files if p.name.endswith(_WEIGHT_SUFFIXES))
    return _Side(RepoSize(name, "local", total, total, False, True), Path(folder), True, weights)


def _count_target(side: _Side, config: LoadConfig) -> tuple[int, int, str, Any]:
    """(parameters, quantizable, source, config or None) for the target."""
    folder = side.folder
    target_config = None
    if folder is not None and is_gguf_path(str(folder)):
        if folder.is_file():  # parameters from the file's metadata: dequantized on load
            target_config = text_config(read_target_config(str(folder)))
            return (*config_parameters(target_config), "gguf", target_config)
        params = side.weight_bytes * 2  # about 4 bits per weight before it is downloaded
        return params, params, "download_size", None
    if folder is not None and (folder / "config.json").is_file():
        target_config = text_config(read_target_config(str(folder), config.trust_remote_code))
    if side.complete and folder is not None:
        counted = safetensors_parameters(folder)
        if counted is not None:
            return counted[0], counted[1], "safetensors", target_config
    if target_config is not None:
        return (*config_parameters(target_config), "config", target_config)
    params = side.weight_bytes // CHECKPOINT_BYTES_PER_PARAM
    return params, params, "download_size", None


def _count_head(side: _Side) -> int:
    if side.complete and side.folder is not None:
        counted = safetensors_parameters(side.folder, skip="embed_tokens")
        if counted is not None:
            return counted[0]
    return side.weight_bytes // CHECKPOINT_BYTES_PER_PARAM


def _has_weights(folder: Path, gguf_file: str | None = None) -> bool:
    """config.json and every weight shard are present (a half-finished download is not)."""
    if gguf_file is not None:
        return (folder / gguf_file).is_file()
    if not (folder / "config.json").is_file():
        return False
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = folder / index_name
        if index.is_file():
            shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
            return all((folder / shard).is_file() for shard in shards)
    return any((folder / name).is_file() for name in ("model.safetensors", "pytorch_model.bin"))


def _offline() -> bool:
    return offline_env()


# ---- memory estimate, before anything is loaded ----------------------------------------------


def safetensors_parameters(folder: str | Path, skip: str = "") -> tuple[int, int] | None:
    """(all, quantizable) parameter counts from the safetensors headers in ``folder``; the
    headers are a few kB at the start of each file, so no weight is read. None without files.
    Tensors whose name starts with ``skip`` (a head's copy of the target embedding) are left out."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        return None
    total = quantizable = 0
    for file in files:
        header = check_safetensors(file)
        for name, entry in header.items():
            if name == "__metadata__" or (skip and name.startswith(skip)):
                continue
            numel = 1
            for dim in entry["shape"]:
                numel *= int(dim)
            total += numel
            if len(entry["shape"]) == 2 and not any(part in name for part in _UNQUANTIZED):
                quantizable += numel
    return total, quantizable


def config_parameters(target_config: Any) -> tuple[int, int]:
    """(all, quantizable) parameters of a Llama-style decoder from its config (MoE aware)."""
    c = target_config
    hidden, layers, vocab = int(c.hidden_size), int(c.num_hidden_layers), int(c.vocab_size)
    heads = int(c.num_attention_heads)
    kv_heads = int(getattr(c, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(c, "head_dim", None) or hidden // heads)
    experts = int(getattr(c, "num_local_experts", None) or getattr(c, "num_experts", None) or 1)
    inter = int(getattr(c, "moe_intermediate_size", None) or c.intermediate_size)
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    mlp = 3 * hidden * inter * experts + (hidden * experts if experts > 1 else 0)
    quantizable = layers * (attention + mlp)
    embeddings = vocab * hidden * (1 if getattr(c, "tie_word_embeddings", False) else 2)
    return quantizable + embeddings + (2 * layers + 1) * hidden, quantizable


def weight_memory_bytes(
    parameters: int, quantizable: int, dtype: torch.dtype, quantization: str
) -> int:
    """Bytes to hold the weights: quantized Linear layers, everything else in ``dtype``."""
    float_bytes = DTYPE_BYTES[dtype]
    if quantization == "none":
        return parameters * float_bytes
    rest = parameters - quantizable
    return int(quantizable * QUANT_BYTES[quantization] + rest * float_bytes)


def int8_readout_bytes(target_config: Any, quantization: str) -> int:
    """The packed int8 readout an int8 load adds (0 otherwise, or without a config)."""
    if quantization != "int8" or target_config is None:
        return 0
    return int(INT8_READOUT_BYTES * int(target_config.vocab_size) * int(target_config.hidden_size))


def kv_bytes_per_token(target_config: Any, dtype: torch.dtype) -> int:
    c = target_config
    heads = int(c.num_attention_heads)
    kv_heads = int(getattr(c, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(c, "head_dim", None) or int(c.hidden_size) // heads)
    return 2 * int(c.num_hidden_layers) * kv_heads * head_dim * DTYPE_BYTES[dtype]


def check_memory_fits(needed: int, config: LoadConfig) -> None:
    """Refuse a load whose weights alone cannot fit, before the OS or CUDA kills the process."""
    device = choose_device()
    if device.type == "cuda" and not config.device_map:
        free, _ = torch.cuda.mem_get_info(device)
        where = f"{torch.cuda.get_device_name(device)} has {format_bytes(free)} free"
    elif device.type == "cpu":
        free = available_ram()
        where = f"the machine has {format_bytes(free)} of RAM available"
    else:
        return
    if free and needed > free:
        raise ResourceError(
            f"the weights need about {format_bytes(needed)} but {where}",
            hint="try quantization 4bit or 8bit, a smaller model, or device_map=auto",
        )


def available_ram() -> int:
    """Bytes of RAM the OS can still give (0 where unknown)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0
