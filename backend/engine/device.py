"""The one place that knows about accelerator synchronisation (for honest timings)."""

from __future__ import annotations

import time

import torch


def device_sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def now(device: torch.device) -> float:
    """Wall time after the device has finished the queued work."""
    device_sync(device)
    return time.perf_counter()
