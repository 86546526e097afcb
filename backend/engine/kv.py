"""KV-cache bookkeeping over transformers' cache objects, for the target and the head alike.

After a tree verification the cache holds ``committed + N`` entries, the last N in tree order.
Only the root and the accepted path survive; their entries are not contiguous in the tree, so
they are GATHERED into the slots right after the committed prefix (slicing would keep the
wrong nodes' keys). The cache grows by concatenation, so long chats never overflow a buffer.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


def new_cache() -> DynamicCache:
    """A growable cache with full-attention layers (sliding windows are applied by the mask)."""
    return DynamicCache()


def cache_length(cache: DynamicCache) -> int:
    return cache.get_seq_length()


def truncate(cache: DynamicCache, length: int) -> None:
    """Drop every entry after the first ``length`` (e.g. a head's speculative tree entries)."""
    for layer in cache.layers:
        if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
            continue
        layer.keys = layer.keys[..., :length, :]
        layer.values = layer.values[..., :length, :]


def keep_tree_entries(cache: DynamicCache, committed: int, keep: torch.Tensor) -> None:
    """Keep the tree entries at offsets ``keep`` (ascending, after ``committed``), packed."""
    for layer in cache.layers:
        if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
            continue
        index = keep.to(layer.keys.device) + committed
        new_len = committed + keep.numel()
        layer.keys[..., committed:new_len, :] = layer.keys.index_select(-2, index)
        layer.values[..., committed:new_len, :] = layer.values.index_select(-2, index)
        layer.keys = layer.keys[..., :new_len, :]
        layer.values = layer.values[..., :new_len, :]
