"""Fold an EAGLE-1/2 head's ``fc`` bias into a head-owned copy of the token embedding, so that
loaders whose EAGLE-1 model has no fc bias (vLLM) compute the same drafts.

fc(concat(e, f)) = W_e e + W_f f + b. With c solving W_e c = b, the head reading the shifted
embedding e + c and no bias computes exactly the same, for every token and feature. The shift
is one row vector added to every embedding row; W_e is square, and a (near-)singular W_e is
reported instead of folded approximately.
"""

from __future__ import annotations

import dataclasses

import torch

from models.errors import CheckpointError
from models.heads.base import DraftHead
from models.heads.config import HeadKind
from models.heads.registry import head_class

MAX_RELATIVE_RESIDUAL = 1e-6  # of ||W_e c - b|| / ||b||, in float64


def fold_fc_bias(head: DraftHead, embedding: torch.Tensor) -> DraftHead:
    """A copy of ``head`` without fc bias and with its own embedding ``embedding + c``."""
    if head.kind is not HeadKind.EAGLE1:
        raise CheckpointError("only EAGLE-1/2 heads have an fc bias to fold")
    if head.fc.bias is None:
        raise CheckpointError("this head has no fc bias: nothing to fold")
    hidden = head.config.hidden_size
    weight = head.fc.weight.detach().cpu().double()
    bias = head.fc.bias.detach().cpu().double()
    embedding_part = weight[:, :hidden]  # fc reads concat(embedding, feature)
    shift = torch.linalg.lstsq(embedding_part, bias[:, None]).solution[:, 0]
    residual = (embedding_part @ shift - bias).norm() / bias.norm().clamp(min=1e-30)
    if residual > MAX_RELATIVE_RESIDUAL:
        raise CheckpointError(
            f"cannot fold the fc bias: the embedding half of fc is singular (relative residual "
            f"{float(residual):.1e})",
            hint="serve this head with EagleChat or the reference code, which keep the bias",
        )
    config = dataclasses.replace(head.config, bias=False, extra=dict(head.config.extra))
    folded = head_class(HeadKind.EAGLE1)(config, with_embedding=True)
    state = {k: v.float() for k, v in head.state_dict().items() if k != "fc.bias"}
    state["embed_tokens.weight"] = (embedding.detach().double().cpu() + shift).float()
    folded.load_state_dict(state, strict=True)
    return folded.eval()
