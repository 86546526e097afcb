"""The one place that chooses the device a model runs on, knows about accelerator
synchronisation (for honest timings) and names the hardware that timings were taken on."""

from __future__ import annotations

import os
import time
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
