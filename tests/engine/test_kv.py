"""The cache's growable layers: appends land in a buffer with room to spare instead of copying
the whole history, and hold exactly what concatenation would, through gathers and cuts."""

from __future__ import annotations

import pytest
import torch

from backend.engine import kv


def _entries(count: int, seed: int) -> torch.Tensor:
    return torch.randn(1, 2, count, 4, generator=torch.Generator().manual_seed(seed))


def _append(cache, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return cache.update(keys, -keys, 0)


def test_appends_reuse_the_buffer_and_equal_concatenation() -> None:
    cache = kv.new_cache()
    expected = _entries(10, 0)
    with torch.inference_mode():
        _append(cache, expected)
        first_buffer = cache.layers[0].keys.data_ptr()
        for step in range(1, 6):
            new = _entries(1, step)
            keys, values = _append(cache, new)
            expected = torch.cat([expected, new], dim=-2)
            assert torch.equal(keys, expected) and torch.equal(values, -expected)
    # the first fill left room, so every one-token step was written in place
    assert cache.layers[0].keys.data_ptr() == first_buffer
    assert kv.cache_length(cache) == 15


def test_gather_and_cut_then_append_keep_the_right_entries() -> None:
    cache = kv.new_cache()
    prefix, tree = _entries(6, 1), _entries(5, 2)
    with torch.inference_mode():
        _append(cache, prefix)
        _append(cache, tree)
        kv.keep_tree_entries(cache, committed=6, keep=torch.tensor([0, 2, 3]))
        nxt = _entries(2, 3)
        keys, _ = _append(cache, nxt)
    kept = tree[..., [0, 2, 3], :]
    assert torch.equal(keys, torch.cat([prefix, kept, nxt], dim=-2))
    with torch.inference_mode():
        kv.truncate(cache, 4)
        keys, _ = _append(cache, nxt)
    assert torch.equal(keys, torch.cat([prefix[..., :4, :], nxt], dim=-2))


def test_a_kept_prefix_is_cut_in_place_and_appends_follow_it() -> None:
    """A chain's accepted drafts (or the root alone) are the first tree entries: no gather."""
    cache = kv.new_cache()
    prefix, tree = _entries(6, 1), _entries(5, 2)
    with torch.inference_mode():
        _append(cache, prefix)
        _append(cache, tree)
        buffer = cache.layers[0].keys.data_ptr()
        kv.keep_tree_entries(cache, committed=6, keep=torch.tensor([0, 1, 2]))
        assert kv.cache_length(cache) == 9 and cache.layers[0].keys.data_ptr() == buffer
        nxt = _entries(2, 3)
        keys, values = _append(cache, nxt)
    expected = torch.cat([prefix, tree[..., :3, :], nxt], dim=-2)
    assert torch.equal(keys, expected) and torch.equal(values, -expected)


def test_growing_past_the_room_and_replaced_tensors_start_a_new_buffer() -> None:
    cache = kv.new_cache()
    with torch.inference_mode():
        _append(cache, _entries(2, 4))
        layer = cache.layers[0]
        room = layer._key_buffer.shape[-2]
        big = _entries(room, 5)  # more than the buffer holds
        keys, _ = _append(cache, big)
        assert keys.shape[-2] == room + 2 and layer._key_buffer.shape[-2] > room + 2
        layer.keys = layer.keys.clone()  # as transformers' batch methods do
        layer.values = layer.values.clone()
        before = layer.keys.clone()
        keys, _ = _append(cache, _entries(1, 6))
    assert torch.equal(keys[..., :-1, :], before)
    assert keys.data_ptr() == layer._key_buffer.data_ptr()


def test_the_head_cache_holds_what_the_growing_layers_hold() -> None:
    """Appends, a cut back to the committed prefix (a draft tree dropped), appends again and
    growth past the spare room: the head's own cache shows attention the same entries."""
    head_cache, layered = kv.HeadCache(), kv.new_cache()
    steps = [("append", 5), ("append", 3), ("cut", 6), ("append", 2), ("append", 90), ("cut", 4)]
    for index, (action, count) in enumerate(steps):
        if action == "cut":
            head_cache.truncate(count)
            kv.truncate(layered, count)
            continue
        entries = _entries(count, index)
        keys, values = _append(head_cache, entries)
        expected_keys, expected_values = _append(layered, entries)
        assert torch.equal(keys, expected_keys) and torch.equal(values, expected_values)
        assert head_cache.get_seq_length() == kv.cache_length(layered)
    assert head_cache.get_seq_length() == 4


@pytest.mark.parametrize("make_cache", [kv.new_cache, kv.HeadCache], ids=["layers", "head"])
def test_a_cache_filled_under_inference_mode_still_grows_outside_it(make_cache) -> None:
    cache = make_cache()
    first = _entries(3, 7)
    with torch.inference_mode():
        _append(cache, first)
    with torch.no_grad():
        keys, _ = _append(cache, _entries(1, 8))
    assert torch.equal(keys[..., :3, :], first) and keys.shape[-2] == 4
