"""Attention whose result for a query row does not depend on the other rows in the call: what
int8 targets need beside their exact linears (int8_linear.py).

A one-token step attends over the keys before it; the same token verified in a tree attends
over the same keys, but inside one call with the tree's other nodes, its row padded by keys it
must not see (masked) and the products laid out for the whole block. Fused attention kernels
then add the same numbers in another order, and the last bits of the result move. A float model
shrugs that off; an int8 model rounds each activation to one of 255 steps, so a last-bit change
can move a step, and greedy EAGLE would drift from vanilla decoding of the same int8 model.

Here every query row of a decoding call (at most EXACT_ROWS rows: steps, chains, trees) is
computed on its own, over exactly the keys it may see, in position order: the same tensors of
the same shapes as a one-token step at that position, hence the same bits. Keys that form one
unbroken run (every step and chain row, a sliding window) are read in place; a tree row's keys
(the past and its own ancestors) are gathered. Larger calls (the
prompt) run transformers' SDPA as usual: vanilla decoding and EAGLE share that call anyway.
"""

from __future__ import annotations

import torch
from torch import nn

NAME = "eaglechat_exact"  # the attention implementation's registered name
EXACT_ROWS = 64  # query rows up to which a call is computed row by row (CPU trees: <= 60)


def register() -> None:
    """Make NAME known to transformers (attention and mask creation, the latter as for SDPA)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    AttentionInterface.register(NAME, exact_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


def use_exact_attention(model: nn.Module) -> str:
    """Switch ``model`` to NAME; returns the implementation it had (to switch back)."""
    register()
    before = model.config._attn_implementation
    model.set_attn_implementation(NAME)
    return before


def exact_attention_forward(
    module: nn.Module,
    query: torch.Tensor,  # [1, heads, q, head_dim]
    key: torch.Tensor,  # [1, kv_heads, k, head_dim]
    value: torch.Tensor,  # [1, kv_heads, k, head_dim]
    attention_mask: torch.Tensor | None,  # [1, 1, q, k] additive float (or bool), or None
    **options,  # scaling, sliding_window, softcap, dropout (0 at inference), ...
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: returns ([1, q, heads, head_dim], None)."""
    rows = query.shape[2]
    if rows > EXACT_ROWS or query.shape[0] != 1:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, **options)
    scale = options.get("scaling") or query.shape[-1] ** -0.5
    softcap = options.get("softcap")
    if attention_mask is None:  # causal, maybe windowed: every row's keys are one run
        runs = _causal_runs(rows, key.shape[2], options.get("sliding_window"))
    else:
        visible = _visible(attention_mask, key.shape[2])
        runs = _runs(visible)
    kv_heads, head_dim = key.shape[1], key.shape[3]
    groups = query.shape[1] // kv_heads
    out = []
    for row in range(rows):
        if runs[row] is not None:  # one run of keys (steps, chains, windows): read in place
            start, stop = runs[row]
            k, v = key[0, :, start:stop], value[0, :, start:stop]  # [kv_heads, n, head_dim]
        else:
            keys = visible[row].nonzero().squeeze(1)  # the positions it sees, in order
            k = key[0].index_select(1, keys)
            v = value[0].index_select(1, keys)
        q = query[0, :, row].reshape(kv_heads, groups, head_dim).contiguous()
        scores = torch.matmul(q, k.transpose(1, 2)) * scale  # [kv_heads, groups, n]
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        weights = scores.float().softmax(-1).to(v.dtype)
        out.append(torch.matmul(weights, v).reshape(kv_heads * groups, head_dim))
    return torch.stack(out)[None], None  # [1, q, heads, head_dim]


def _runs(visible: torch.Tensor) -> list[tuple[int, int] | None]:
    """Per query row, (start, stop) when the keys it sees are one unbroken run, else None."""
    count = visible.sum(-1)
    start = visible.int().argmax(-1)
    position = torch.arange(visible.shape[-1])
    run = (position >= start[:, None]) & (position < (start + count)[:, None])
    whole = ((run == visible).all(-1) & (count > 0)).tolist()
    return [
        (first, first + n) if ok else None
        for ok, first, n in zip(whole, start.tolist(), count.tolist())
    ]


def _causal_runs(rows: int, keys: int, window: int | None) -> list[tuple[int, int] | None]:
    """Per query row (the last ``rows`` positions), the run of keys up to its own, the last
    ``window`` of them when one is given: no mask to read, so no tensor work per call."""
    runs: list[tuple[int, int] | None] = []
    for row in range(rows):
        stop = keys - rows + row + 1  # past the row's own position
        runs.append((max(0, stop - window) if window is not None else 0, stop))
    return runs


def _visible(mask: torch.Tensor, keys: int) -> torch.Tensor:
    """Which keys each query row sees: the mask's zeros (True in a bool mask)."""
    block = mask[0, 0, :, :keys] if mask.dim() == 4 else mask[:, :keys]
    return block if block.dtype == torch.bool else block == 0
