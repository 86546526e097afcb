"""Training an EAGLE-3 ``fc`` on features of very different sizes: its weight is trained as
``trained / scale`` per input column (a parametrization), and saved as an ordinary Linear.

    scale_fc_inputs(head, feature_scale(features, mask))   # before the optimizer sees fc
    save_head(plain_head(head), out)                         # the official format
"""

from __future__ import annotations

import torch
from torch import nn

from models.errors import ConfigError
from models.heads.base import DraftHead
from models.heads.registry import head_class


class _DividedColumns(nn.Module):
    """fc.weight = trained / scale (per input channel): the head trains as if its features were
    divided by their typical size, yet its fc is an ordinary Linear on the raw features.

    Some targets' residual streams are large (Gemma's reach the hundreds, with outlier channels
    far beyond): an fc output of that size swamps the midlayer's residual updates and the head
    stops learning. Dividing the trained weight instead of the input keeps the optimizer's steps
    in proportion to each column."""

    def __init__(self, scale: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("scale", scale)

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight / self.scale

    def right_inverse(self, weight: torch.Tensor) -> torch.Tensor:
        return weight * self.scale


def feature_scale(features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-channel RMS of target features [B, S, F] over real tokens after the first (attention
    sinks carry outliers), never below 1: small features are left as they are."""
    valid = mask.clone()
    valid[:, 0] = False
    rows = features[valid] if valid.any() else features.flatten(0, 1)
    return rows.float().pow(2).mean(0).sqrt().clamp(min=1.0)


def scale_fc_inputs(head: DraftHead, scale: torch.Tensor) -> None:
    """Train ``head.fc`` through :class:`_DividedColumns`; its fresh initialisation is kept as
    the trained weight, so the scaled features start at the usual size."""
    from torch.nn.utils import parametrize

    initial = head.fc.weight.detach().clone()
    parametrize.register_parametrization(
        head.fc, "weight", _DividedColumns(scale.to(initial.device, initial.dtype))
    )
    head.fc.parametrizations.weight.original.data.copy_(initial)


def plain_head(head: DraftHead) -> DraftHead:
    """The head with an ordinary fc (the official format), for saving and evaluation copies."""
    if not hasattr(head.fc, "parametrizations"):
        return head
    plain = head_class(head.kind)(head.config).to(head.fc.weight.device)
    state = {k: v for k, v in head.state_dict().items() if ".parametrizations." not in k}
    state["fc.weight"] = head.fc.weight.detach().clone()
    plain.load_state_dict(state, strict=True)
    plain.bind_target(head.embedding, head._borrowed.get("lm_head"))
    return plain


def load_plain_state(head: DraftHead, state: dict[str, torch.Tensor]) -> None:
    """Load an ordinary state dict into a head whose fc may be trained through scaled columns."""
    if not hasattr(head.fc, "parametrizations"):
        head.load_state_dict(state, strict=True)
        return
    fc_weight = state["fc.weight"]
    rest = {k: v for k, v in state.items() if k != "fc.weight"}
    expected = {k for k in head.state_dict() if ".parametrizations." not in k} - {"fc.weight"}
    if set(rest) != expected:
        raise ConfigError("checkpoint keys do not match the head being trained")
    head.load_state_dict(rest, strict=False)
    scale = head.fc.parametrizations.weight[0].scale
    head.fc.parametrizations.weight.original.data.copy_(fc_weight.to(scale.device) * scale)
