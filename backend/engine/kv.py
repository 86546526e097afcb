"""KV-cache bookkeeping over transformers' cache objects, for the target and the head alike.

After a tree verification the cache holds ``committed + N`` entries, the last N in tree order.
Only the root and the accepted path survive; their entries are not contiguous in the tree, so
they are GATHERED into the slots right after the committed prefix (slicing would keep the
wrong nodes' keys). Each layer appends in place into a buffer with spare room that grows
geometrically (``GrowingLayer``): a step copies only its own new entries, where concatenation
would copy the whole history every step, and long chats still never overflow a fixed buffer.

Sliding-window layers keep their whole history too (so the same gather and cut work on them)
but hand attention only the keys a new token can still see: a round then costs the same on a
long chat as on a short one in those layers, instead of attending over the whole prefix
through a mask that hides most of it.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose ``keys``/``values`` are views of larger buffers. Anything that
    replaces them with other tensors (transformers' batch methods) just makes the next append
    copy into a fresh buffer."""

    def __init__(self) -> None:
        super().__init__()
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys, self._key_buffer = _append(self.keys, self._key_buffer, key_states)
        self.values, self._value_buffer = _append(self.values, self._value_buffer, value_states)
        return self.keys, self.values

    def reset(self) -> None:
        self._key_buffer = self._value_buffer = None
        super().reset()


def _append(
    stored: torch.Tensor, buffer: torch.Tensor | None, new: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``stored`` followed by ``new``, written into ``buffer`` when ``stored`` is its opening
    and there is room; otherwise into a new buffer with a quarter spare."""
    length = stored.shape[-2] if stored.dim() == new.dim() else 0  # empty: a 1-d placeholder
    end = length + new.shape[-2]
    fits = (
        buffer is not None
        and end <= buffer.shape[-2]
        and buffer.shape[:-2] == new.shape[:-2]
        and (length == 0 or stored.data_ptr() == buffer.data_ptr())
        and buffer.dtype == new.dtype
        # a buffer made under inference mode cannot be written outside it
        and (torch.is_inference_mode_enabled() or not buffer.is_inference())
    )
    if not fits:
        buffer = _regrown(stored, new, length, end)
    buffer[..., length:end, :] = new
    return buffer[..., :end, :], buffer


_MIN_SPARE = 64  # entries of room past the end at least: a few rounds before the next copy


def _regrown(
    buffer: torch.Tensor | None, like: torch.Tensor, length: int, end: int
) -> torch.Tensor:
    """A buffer for ``end`` entries and a quarter spare, holding the first ``length`` of
    ``buffer``."""
    capacity = end + max(_MIN_SPARE, end // 4)
    grown = like.new_empty(*like.shape[:-2], capacity, like.shape[-1])
    if length:
        grown[..., :length, :] = buffer[..., :length, :]
    return grown


class WindowedLayer(GrowingLayer):
    """A sliding-window layer: stores every entry, shows attention the last ``window - 1`` entries
    before the new tokens plus the new tokens. ``get_mask_sizes`` tells the model's own mask
    builder the same, so masks and keys line up for plain steps and chains alike."""

    is_sliding = True

    def __init__(self, sliding_window: int) -> None:
        super().__init__()
        self.sliding_window = sliding_window

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = super().update(key_states, value_states)
        shown = visible_keys(keys.shape[-2] - key_states.shape[-2], self.sliding_window)
        shown += key_states.shape[-2]
        return keys[..., -shown:, :], values[..., -shown:, :]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        past = self.get_seq_length()
        shown = visible_keys(past, self.sliding_window)
        return shown + query_length, past - shown  # keys shown, position of the first


def visible_keys(past: int, window: int) -> int:
    """How many of ``past`` cached entries a window of ``window`` positions still shows to the
    next token (and so to every deeper one that the window covers less)."""
    return min(past, window - 1)


class HeadCache:
    """The draft head's one-layer KV, appended in place like ``GrowingLayer`` but without a
    ``DynamicCache`` around it: the head updates it on every draft step, where the
    dispatch costs more than the copy. Has what the head's attention and the drafter use."""

    def __init__(self) -> None:
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None
        self.length = 0

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.length + key_states.shape[-2]
        if (
            self._keys is None
            or end > self._keys.shape[-2]
            # a buffer made under inference mode cannot be written outside it
            or (self._keys.is_inference() and not torch.is_inference_mode_enabled())
        ):
            self._keys = _regrown(self._keys, key_states, self.length, end)
            self._values = _regrown(self._values, value_states, self.length, end)
        self._keys[..., self.length : end, :] = key_states
        self._values[..., self.length : end, :] = value_states
        self.length = end
        return self._keys[..., :end, :], self._values[..., :end, :]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)


def new_cache(layer_windows: tuple[int | None, ...] = ()) -> DynamicCache:
    """A growable cache; layers with a window in ``layer_windows`` show attention only what
    the window covers (no windows: full-attention layers, created as the model needs them)."""
    cache = DynamicCache()
    if any(layer_windows):
        cache.layers = [WindowedLayer(w) if w else GrowingLayer() for w in layer_windows]
        cache.layer_class_to_replicate = None
    else:
        cache.layer_class_to_replicate = GrowingLayer
    return cache


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
    """Keep the tree entries at offsets ``keep`` (ascending from 0, after ``committed``),
    packed. A prefix (a chain's accepted drafts, or the root alone) is in place: only cut."""
    if int(keep[-1]) == keep.numel() - 1:
        truncate(cache, committed + keep.numel())
        return
    for layer in cache.layers:
        if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
            continue
        index = keep.to(layer.keys.device) + committed
        new_len = committed + keep.numel()
        layer.keys[..., committed:new_len, :] = layer.keys.index_select(-2, index)
        layer.values[..., committed:new_len, :] = layer.values.index_select(-2, index)
        layer.keys = layer.keys[..., :new_len, :]
        layer.values = layer.values[..., :new_len, :]
