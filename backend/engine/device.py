"""The one place that chooses the device a model runs on, knows about accelerator
synchronisation (for honest timings), names the hardware that timings were taken on, and sets
how many CPU threads a stretch of work runs on."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from backend.errors import ConfigError


def choose_device(requested: str | None = None) -> torch.device:
    """``requested`` ("cuda:1", "cpu", ...) as given; with none (or "auto") the first GPU if
    there is one, else the CPU. Serving, benchmarks, memory plans and training all ask here."""
    if requested in (None, "", "auto"):
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(requested)
    except RuntimeError as err:
        raise ConfigError(
            f"unknown device {requested!r}", hint="use auto, cpu, cuda, cuda:1, mps, ..."
        ) from err


def device_sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def now(device: torch.device) -> float:
    """Wall time after the device has finished the queued work."""
    device_sync(device)
    return time.perf_counter()


def hardware_name(device: torch.device) -> str:
    """The GPU's name, or the CPU model and core count (timings only carry over on the same)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model or device.type}, {os.cpu_count()} cores"


@contextlib.contextmanager
def cpu_threads(count: int | None) -> Iterator[None]:
    """Run the block on ``count`` intra-op CPU threads, then restore the previous count.
    None or 0 leaves the count alone. Switching costs next to nothing, so callers can set a
    count per stretch of work (the decoding rounds, not the prompt's prefill)."""
    previous = torch.get_num_threads()
    if not count or count == previous:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
