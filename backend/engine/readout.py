"""A faster CPU path for the target's output projection over a few rows (tree verification).

On CPUs, ``F.linear`` over a handful of rows and a large vocabulary can cost several times its
one-row cost, while the same product computed as ``weight @ x.T`` streams the weight once for
all rows. Verification multiplies 2-60 rows by the readout on every round, plain decoding one:
the rows-first form is what makes verifying a small tree cost about one step on such models.

The swap replaces only the ``forward`` of the model's own ``nn.Linear`` instance (as quantizers
replace layers at load), so the model stays a stock transformers model with the same weights;
one-row products keep ``F.linear``. It is applied only where a timing at load shows it pays.
"""

from __future__ import annotations

import time
import types

import torch
import torch.nn.functional as F
from torch import nn

TIMING_ROWS = 8  # rows timed when deciding, a typical verified tree
MIN_GAIN = 1.15  # the rows-first product must be at least this much faster to be used


def rows_first_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``F.linear`` computed as ``(weight @ x.T).T`` when more than one row comes in."""
    rows = x.numel() // x.shape[-1]
    if rows < 2:
        return F.linear(x, self.weight, self.bias)
    out = (self.weight @ x.reshape(rows, x.shape[-1]).T).T
    if self.bias is not None:
        out = out + self.bias
    return out.reshape(*x.shape[:-1], self.weight.shape[0])


def swappable(linear: nn.Module) -> bool:
    """A plain float ``nn.Linear`` on the CPU whose forward nobody else has wrapped."""
    return (
        type(linear) is nn.Linear
        and linear.weight.device.type == "cpu"
        and linear.weight.is_floating_point()
        and not hasattr(linear, "_hf_hook")  # accelerate's offload hooks own its forward
    )


def time_both(linear: nn.Linear, repeats: int = 3) -> tuple[float, float]:
    """Best-of-``repeats`` seconds of ``F.linear`` and of the rows-first form on TIMING_ROWS."""
    x = torch.randn(TIMING_ROWS, linear.in_features, dtype=linear.weight.dtype)
    stock, rows_first = [], []
    with torch.inference_mode():
        for _ in range(repeats):
            start = time.perf_counter()
            F.linear(x, linear.weight, linear.bias)
            stock.append(time.perf_counter() - start)
            start = time.perf_counter()
            rows_first_forward(linear, x)
            rows_first.append(time.perf_counter() - start)
    return min(stock), min(rows_first)


def speed_up_readout(model: nn.Module, force: bool | None = None) -> bool:
    """Give the model's output projection the rows-first forward if it pays on this machine
    (``force`` True/False skips the timing). Returns whether it was applied."""
    linear = model.get_output_embeddings()
    if linear is None or not swappable(linear):
        return False
    if force is None:
        stock, rows_first = time_both(linear)
        force = stock > MIN_GAIN * rows_first
    if force:
        linear.forward = types.MethodType(rows_first_forward, linear)
    return force


def uses_rows_first(model: nn.Module) -> bool:
    linear = model.get_output_embeddings()
    forward = getattr(linear, "forward", None)
    return getattr(forward, "__func__", None) is rows_first_forward
