"""The one way the engine swaps the ``forward`` of a model's own ``nn.Linear`` at load, and undoes
it: the faster CPU forms (projection_forms.py, decoder_projections.py) and the int8 forms
(int8_linear.py) all go through :func:`swap`.

A swap replaces only the instance's ``forward`` (and adds the attributes it needs), so the model
stays a stock transformers model. Each swap records the weight it was made for, and every call
checks it first (two integer comparisons):
- the weight's storage was replaced (``.to(dtype or device)``, ``param.data = ...``, a new
  Parameter): the recorded storage is kept alive by the record, so a new one can never reuse
  its address;
- its values were updated in place (an optimizer step, ``load_state_dict``, ``copy_``) while the
  swap holds a copy of them (a packed or quantized matrix): ``weight._version`` moved on.
Writes through ``weight.data`` bypass the version counter and go unseen.

What happens then depends on the swap: float forms fall back to the stock forward (the group
of linears that share one product with it too) and log it once; an int8 swap, whose float
weights are gone, refuses with an error, and refuses ``.to()`` itself. :func:`restore` undoes
every swap below a module.
"""

from __future__ import annotations

import logging
import threading
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from backend.errors import ConfigError

logger = logging.getLogger(__name__)

RECORD = "linear_swap"  # the instance attribute holding a swapped linear's Swap


@dataclass(eq=False)
class Swap:
    """What one swapped linear runs, and the weight it was made for."""

    forward: Callable[[nn.Linear, torch.Tensor], torch.Tensor]
    attributes: tuple[str, ...]  # instance attributes the swap added (dropped on undo)
    weight: torch.Tensor  # the weight's tensor then, kept alive: its address stays unique
    pointer: int
    version: int
    copies: bool  # the swap holds a copy of the weight's values: in-place updates make it stale
    refuse_changes: bool  # stale: raise (int8: the float weights are gone) instead of stock
    group: list[nn.Linear] = field(default_factory=list)  # undone together (shared product)
    undo: Callable[[nn.Linear], None] | None = None  # more to undo (int8: float weights back)


def swap(
    linear: nn.Linear,
    forward: Callable[[nn.Linear, torch.Tensor], torch.Tensor],
    attributes: dict[str, Any],
    *,
    copies: bool,
    refuse_changes: bool = False,
    undo: Callable[[nn.Linear], None] | None = None,
) -> Swap:
    """Run ``forward`` as ``linear``'s forward, with ``attributes`` set on the instance, until
    :func:`unswap`. An earlier swap of ``linear`` is undone first."""
    unswap(linear)
    weight = linear.weight
    record = Swap(
        forward=forward,
        attributes=tuple(attributes),
        weight=weight.detach(),
        pointer=weight.data_ptr(),
        version=weight._version,
        copies=copies,
        refuse_changes=refuse_changes,
        undo=undo,
    )
    linear.__dict__.update(attributes)
    linear.__dict__[RECORD] = record
    linear.forward = types.MethodType(_checked_forward, linear)
    if refuse_changes:
        linear._apply = types.MethodType(_refuse_conversion, linear)
    return record


def group(linears: Iterable[nn.Linear]) -> None:
    """Swapped ``linears`` that share one product: when one goes stale, all are undone."""
    members = list(linears)
    for linear in members:
        linear.__dict__[RECORD].group = members


def record_of(linear: nn.Module) -> Swap | None:
    return linear.__dict__.get(RECORD)


def _checked_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    record = self.__dict__[RECORD]
    weight = self._parameters["weight"]
    if weight.data_ptr() != record.pointer or (record.copies and weight._version != record.version):
        return _stale(self, record, x)
    return record.forward(self, x)


def _stale(linear: nn.Linear, record: Swap, x: torch.Tensor) -> torch.Tensor:
    if record.refuse_changes:
        raise ConfigError(
            "the int8 target's weights were changed or moved after it was quantized",
            hint="load the target again (with the dtype or device wanted) instead of changing "
            "the loaded model",
        )
    logger.info("a swapped linear's weight changed after load: back to its stock forward")
    for member in record.group or [linear]:
        unswap(member)
    return linear(x)


def _refuse_conversion(self: nn.Linear, fn: Callable, recurse: bool = True) -> nn.Module:
    """``.to()``, ``.float()``, ``.cpu()`` and the like on an int8 linear: allowed only where they
    change nothing (the model's other parameters get there first)."""
    probe = torch.empty(0, device=self._parameters["weight"].device)
    converted = fn(probe)
    if converted.dtype != probe.dtype or converted.device != probe.device:
        raise ConfigError(
            "an int8 target cannot be cast or moved after loading",
            hint="load it again with the dtype or device wanted",
        )
    return self


def unswap(linear: nn.Module) -> bool:
    """``linear`` back to its stock forward (False when it was not swapped)."""
    record = linear.__dict__.pop(RECORD, None)
    if record is None:
        return False
    if record.undo is not None:
        record.undo(linear)
    for name in (*record.attributes, "forward", "_apply"):
        linear.__dict__.pop(name, None)
    return True


def restore(*modules: nn.Module | None) -> int:
    """Every swapped linear under ``modules`` (a target, a head) back to its stock forward, its
    extra copies dropped, int8 weights back in float. Returns how many were undone."""
    undone = 0
    for module in modules:
        if module is None:
            continue
        for linear in list(module.modules()):
            undone += unswap(linear)
    return undone


class Handout:
    """One product computed for linears that read the same tensor (a q/k/v or gate/up group):
    the member whose call computed it keeps it, and each other member takes its slice once, for
    that very input and thread. Nothing stays alive past the last member."""

    def __init__(self, sizes: list[int]) -> None:
        self.slices = [(sum(sizes[:i]), size) for i, size in enumerate(sizes)]  # (start, size)
        self._pending = threading.local()  # [input, product, members yet to take theirs]

    def take(self, index: int, x: torch.Tensor) -> torch.Tensor | None:
        """Member ``index``'s slice of the product kept for ``x``, or None."""
        pending = getattr(self._pending, "value", None)
        if pending is None or pending[0] is not x or index not in pending[2]:
            return None
        pending[2].discard(index)
        if not pending[2]:
            self._pending.value = None
        return pending[1].narrow(-1, *self.slices[index])

    def keep(self, index: int, x: torch.Tensor, product: torch.Tensor) -> torch.Tensor:
        """Keep ``product`` (of ``x``, computed in member ``index``'s call) for the others;
        returns member ``index``'s slice."""
        others = set(range(len(self.slices))) - {index}
        self._pending.value = [x, product, others] if others else None
        return product.narrow(-1, *self.slices[index])

    def forget(self) -> None:
        self._pending.value = None
