"""Attention for int8 targets (exact_attention.py): a query row's output is bit-identical
whether it is computed alone, as a one-token step over the keys it sees, or inside a tree
verification with other rows and a mask."""

from __future__ import annotations

import torch

from backend.engine.exact_attention import EXACT_ROWS, exact_attention_forward


def test_a_tree_row_equals_its_own_one_token_step() -> None:
    generator = torch.Generator().manual_seed(0)
    past, heads, kv_heads, dim = 37, 4, 2, 16
    parents = [-1, 0, 0, 1, 2, 3]  # a small tree after ``past`` committed keys
    rows = len(parents)
    query = torch.randn(1, heads, rows, dim, generator=generator)
    key = torch.randn(1, kv_heads, past + rows, dim, generator=generator)
    value = torch.randn(1, kv_heads, past + rows, dim, generator=generator)
    mask = torch.full((1, 1, rows, past + rows), torch.finfo(torch.float32).min)
    mask[..., :past] = 0.0
    for node in range(rows):
        at = node
        while at >= 0:  # the node and its ancestors
            mask[0, 0, node, past + at] = 0.0
            at = parents[at]
    tree, _ = exact_attention_forward(None, query, key, value, mask, scaling=0.25)
    for node in range(rows):
        seen = (mask[0, 0, node] == 0).nonzero().squeeze(1)
        alone, _ = exact_attention_forward(
            None,
            query[:, :, node : node + 1],
            key[:, :, seen],
            value[:, :, seen],
            None,  # a one-token step: causal over every key it is given
            scaling=0.25,
        )
        assert torch.equal(alone[0, 0], tree[0, node]), node
    reference = torch.nn.functional.scaled_dot_product_attention(
        query, key.repeat_interleave(2, 1), value.repeat_interleave(2, 1), mask, scale=0.25
    )
    torch.testing.assert_close(tree[0], reference[0].transpose(0, 1))


def test_a_window_limits_what_a_step_sees() -> None:
    generator = torch.Generator().manual_seed(1)
    query = torch.randn(1, 2, 1, 8, generator=generator)
    key = torch.randn(1, 2, 20, 8, generator=generator)
    value = torch.randn(1, 2, 20, 8, generator=generator)
    windowed, _ = exact_attention_forward(None, query, key, value, None, sliding_window=5)
    last, _ = exact_attention_forward(None, query, key[:, :, -5:], value[:, :, -5:], None)
    assert torch.equal(windowed, last)
    assert EXACT_ROWS >= 64  # trees up to 64 nodes stay exact


def test_rows_without_a_mask_see_what_a_causal_mask_shows_them() -> None:
    """A chain of rows given no mask (causal over the last rows, maybe windowed) gives the
    bits of the same call with that causal mask written out."""
    generator = torch.Generator().manual_seed(2)
    rows, keys = 4, 12
    query = torch.randn(1, 2, rows, 8, generator=generator)
    key = torch.randn(1, 2, keys, 8, generator=generator)
    value = torch.randn(1, 2, keys, 8, generator=generator)
    positions = torch.arange(keys)
    own = (keys - rows + torch.arange(rows))[:, None]
    for window in (None, 3, 20):
        seen = positions[None, :] <= own
        if window is not None:
            seen &= positions[None, :] > own - window
        mask = torch.zeros(1, 1, rows, keys).masked_fill(~seen, torch.finfo(torch.float32).min)
        plain, _ = exact_attention_forward(None, query, key, value, None, sliding_window=window)
        masked, _ = exact_attention_forward(None, query, key, value, mask)
        assert torch.equal(plain, masked), window
