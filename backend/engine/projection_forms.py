"""Faster CPU forms of linear projections: the target's readout, the head's lm_head, and the
target's decoder projections (backend/engine/decoder_projections.py).

On CPUs the stock ``F.linear`` can cost several times its one-row cost as soon as a few rows
come in (verification multiplies 2-60 rows on every round, a draft-tree level several), and
the BLAS library behind it is slow on some CPUs whatever the row count. Other forms compute the
same product:
- rows-first: ``(weight @ x.T).T`` streams the weight once for all rows;
- onednn: oneDNN's product on the weight as it is (no extra memory);
- packed: the weight is re-laid out once at load in oneDNN's blocked format (an extra copy of
  the matrix in memory) and multiplied with no per-call packing.
Which form is fastest depends on the machine and the shape, and differs between one row (plain
decoding, chains) and several (trees), so each projection gets the fastest form per case, timed
at load. The swap replaces only the ``forward`` of the model's own ``nn.Linear`` instance (as
quantizers replace layers at load; linear_swaps.py, which also undoes it and notices a weight
changed under a packed copy): the model stays a stock transformers model with the same weights,
and with gradients on (training) the stock form always runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from backend.engine.linear_swaps import record_of, swap, unswap

# Rows timed per case: one row, and the row counts of tree levels and verified trees (summed:
# the library's speed jumps between neighbouring counts).
TIMING_ROWS = {False: (1,), True: (2, 3, 4, 8, 16)}
TIMING_BUDGET_S = 0.01  # per form and row count, beyond three calls
MIN_GAIN = 1.15  # another form must be at least this much faster than F.linear to be used
PACK_ROWS = 8  # packed layouts suited to tree-sized calls (one-row calls barely mind; a layout
# for one row makes several-row calls far slower)
FORMS = ("stock", "rows-first", "onednn", "packed")


def stock_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, self.weight, self.bias)


def rows_first_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``F.linear`` computed as ``(weight @ x.T).T``."""
    rows = x.numel() // x.shape[-1]
    out = (self.weight @ x.reshape(rows, x.shape[-1]).T).T
    if self.bias is not None:
        out = out + self.bias
    return out.reshape(*x.shape[:-1], self.weight.shape[0])


def onednn_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``F.linear`` through oneDNN, on the weight as it is."""
    return _onednn(x, self.weight, self.bias)


def packed_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``F.linear`` against the weight packed once at load (``self.packed_weight``)."""
    return _onednn(x, self.packed_weight, self.bias, self.weight.shape[0])


def _onednn(x: torch.Tensor, weight: torch.Tensor, bias, out_features: int | None = None):
    rows = x.numel() // x.shape[-1]
    flat = x.reshape(rows, x.shape[-1])
    out = torch.ops.mkldnn._linear_pointwise(flat, weight, bias, "none", [], "")
    return out.reshape(*x.shape[:-1], out_features or weight.shape[0])


_FORWARDS: dict[str, Callable] = {
    "stock": stock_forward,
    "rows-first": rows_first_forward,
    "onednn": onednn_forward,
    "packed": packed_forward,
}


def forward_by_rows(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """The form chosen for one row or for several; the stock one while gradients are on."""
    if torch.is_grad_enabled():
        return F.linear(x, self.weight, self.bias)
    return self.forms[x.numel() > x.shape[-1]](self, x)


def swappable(linear: nn.Module) -> bool:
    """A plain float ``nn.Linear`` on the CPU whose forward nobody else has wrapped (an int8
    swap keeps a tied float weight: it is no float form's to take)."""
    return (
        type(linear) is nn.Linear
        and linear.weight.device.type == "cpu"
        and linear.weight.is_floating_point()
        and not hasattr(linear, "_hf_hook")  # accelerate's offload hooks own its forward
        and not getattr(record_of(linear), "refuse_changes", False)
    )


def _pack(linear: nn.Linear) -> bool:
    """Give ``linear`` its packed weight, laid out for about PACK_ROWS rows per call; False
    where this torch build cannot pack it."""
    if getattr(linear, "packed_weight", None) is not None:
        return True
    try:
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), PACK_ROWS)
            x = torch.zeros(2, linear.in_features, dtype=linear.weight.dtype)
            _onednn(x, packed, linear.bias, linear.out_features)
    except (RuntimeError, AttributeError):
        return False
    linear.packed_weight = packed
    return True


def _runs_onednn(linear: nn.Linear) -> bool:
    """Whether this torch build multiplies ``linear``'s plain weight through oneDNN."""
    try:
        with torch.no_grad():
            x = torch.zeros(2, linear.in_features, dtype=linear.weight.dtype)
            _onednn(x, linear.weight.detach(), linear.bias)
    except (RuntimeError, AttributeError):
        return False
    return True


def time_forms(linear: nn.Linear, many: bool) -> dict[str, float]:
    """Seconds of each form on one row (``many`` False) or summed over the TIMING_ROWS counts;
    each the best of several calls after an untimed first one (small products are timed more
    often: microseconds are noisy)."""
    forms = [f for f in FORMS if _available(linear, f)]
    seconds = dict.fromkeys(forms, 0.0)
    with torch.inference_mode():
        for rows in TIMING_ROWS[many]:
            x = torch.randn(rows, linear.in_features, dtype=linear.weight.dtype)
            for form in forms:
                _FORWARDS[form](linear, x)
                best, spent, calls = float("inf"), 0.0, 0
                while calls < 3 or (spent < TIMING_BUDGET_S and calls < 50):
                    start = time.perf_counter()
                    _FORWARDS[form](linear, x)
                    took = time.perf_counter() - start
                    best, spent, calls = min(best, took), spent + took, calls + 1
                seconds[form] += best
    return seconds


def _available(linear: nn.Linear, form: str) -> bool:
    if form == "packed":
        return getattr(linear, "packed_weight", None) is not None
    if form == "onednn":
        return _runs_onednn(linear)
    return True


Forms = dict[bool, str]  # several rows? -> form name


def choose_forms(linear: nn.Linear, force: str | None = None, pack: bool = True) -> Forms:
    """The form for one row and for several: ``force`` (stock, rows-first, onednn, packed) or
    the fastest by timing, kept only if it beats the stock form by MIN_GAIN. Rows-first is never
    forced on one row, where it is the stock product. ``pack`` False: no packed copy allowed."""
    if force is not None:
        return {False: "stock" if force == "rows-first" else force, True: force}
    if pack:
        _pack(linear)
    chosen = {}
    for many in (False, True):
        seconds = time_forms(linear, many)
        best = min(seconds, key=seconds.get)
        chosen[many] = best if seconds["stock"] > MIN_GAIN * seconds[best] else "stock"
    return chosen


def speed_up(
    linear: nn.Module | None,
    force: str | None = None,
    known: Forms | None = None,
    pack: bool = True,
) -> Forms:
    """Give ``linear`` the fastest form per row count (see ``choose_forms``), or the ``known``
    forms an earlier load of the same weights chose (timing twice could pick differently, and
    the tuner's cached costs were timed with those). Returns the forms it runs."""
    stock = {False: "stock", True: "stock"}
    if linear is None or not swappable(linear):
        return stock
    unswap(linear)
    valid = known is not None and set(known) == {False, True} and set(known.values()) <= set(FORMS)
    forms = dict(known) if valid else choose_forms(linear, force, pack)
    if "packed" in forms.values() and not (pack and _pack(linear)):
        forms = {many: "stock" if form == "packed" else form for many, form in forms.items()}
    if "onednn" in forms.values() and not _runs_onednn(linear):
        forms = {many: "stock" if form == "onednn" else form for many, form in forms.items()}
    packed = linear.__dict__.pop("packed_weight", None)  # kept below only where it is used
    if forms == stock:
        return stock
    attributes = {"forms": {many: _FORWARDS[form] for many, form in forms.items()}}
    if "packed" in forms.values():
        attributes["packed_weight"] = packed
    swap(linear, forward_by_rows, attributes, copies="packed" in forms.values())
    return forms


def speed_up_readout(
    model: nn.Module, force: str | None = None, known: Forms | None = None
) -> Forms:
    """``speed_up`` for the model's output projection."""
    return speed_up(model.get_output_embeddings(), force, known)


def describe(forms: Forms) -> str:
    """``"1 row: stock, more: packed"``, or ``"stock"`` when nothing changed."""
    if set(forms.values()) == {"stock"}:
        return "stock"
    return f"1 row: {forms[False]}, more: {forms[True]}"


def form_of(linear: nn.Module, many: bool) -> str:
    """The form ``linear`` runs for one row or several."""
    record = record_of(linear)
    if record is None or record.forward is not forward_by_rows:
        return "stock"
    return next(name for name, fn in _FORWARDS.items() if fn is linear.forms[many])
