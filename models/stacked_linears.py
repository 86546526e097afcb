"""Linears that read the same input, run as one product: the draft heads' q/k/v and gate/up
(models/heads/layers.py) and the target's (backend/engine/decoder_projections.py)."""

from __future__ import annotations

import torch
from torch import nn


class StackedLinears:
    """Linears that read the same input, run as one product with their outputs side by side.

    ``fuse`` re-seats their weights (and biases) as row blocks of one matrix: the parameters,
    their names and the checkpoint format stay as they are, no second copy of the weights is
    kept, and in-place updates (an optimizer step, ``load_state_dict``) reach the fused matrix
    too. Anything that gives a parameter other storage (``.to()``, a new Parameter) undoes the
    fusion: each linear then runs on its own, as it does while gradients are on.
    """

    def __init__(self, *linears: nn.Linear) -> None:
        self.linears = linears
        self._weight: torch.Tensor | None = None
        self._bias: torch.Tensor | None = None
        self._pointers: tuple[int, ...] = ()

    def fuse(self) -> bool:
        """Fuse if the linears allow it (plain float linears on one real device, all with or all
        without bias, no accelerate hooks); True when fused afterwards."""
        if self.fused:
            return True
        weights = [linear.weight for linear in self.linears]
        has_bias = {linear.bias is not None for linear in self.linears}
        if (
            any(type(lin) is not nn.Linear or hasattr(lin, "_hf_hook") for lin in self.linears)
            or len({(w.device, w.dtype) for w in weights}) != 1
            or weights[0].device.type == "meta"
            or not weights[0].is_floating_point()
            or len(has_bias) != 1
        ):
            return False
        # a normal tensor even when called under inference mode: training may use these weights
        with torch.inference_mode(False), torch.no_grad():
            self._weight = _restack([linear.weight for linear in self.linears])
            if self.linears[0].bias is not None:
                self._bias = _restack([linear.bias for linear in self.linears])
        self._pointers = tuple(linear.weight.data_ptr() for linear in self.linears)
        return True

    @property
    def weight(self) -> torch.Tensor | None:
        """The stacked weight matrix (None until fused)."""
        return self._weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self._bias

    @property
    def fused(self) -> bool:
        if self._weight is None:
            return False
        for linear, pointer in zip(self.linears, self._pointers):  # checked every call: cheaply
            if linear.weight.data_ptr() != pointer:
                return False
        return True

    def product_weights(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(weight, bias) of the one product: the fused matrix at inference, else (gradients
        on, or not fused) the members' stacked anew, so gradients reach each of them."""
        if not torch.is_grad_enabled() and self.fused:
            return self._weight, self._bias
        linears = self.linears
        bias = None if linears[0].bias is None else torch.cat([lin.bias for lin in linears])
        return torch.cat([linear.weight for linear in linears]), bias


def _restack(parameters: list[nn.Parameter]) -> torch.Tensor:
    """One tensor holding ``parameters`` one after another along dim 0; each parameter's data
    becomes its block (a view), so the values live once."""
    stacked = torch.cat([p.detach() for p in parameters])
    for parameter, block in zip(parameters, stacked.split([p.shape[0] for p in parameters])):
        parameter.data = block
    return stacked
