"""Swapped linears (linear_swaps.py) with packing on: one restore undoes every swap, and a weight
cast, moved or updated in place after the swap is never served from a stale packed copy."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from backend.engine import decoder_projections as dp
from backend.engine.linear_swaps import RECORD, restore
from backend.engine.projection_forms import form_of, speed_up, speed_up_readout
from tests.factories import tiny_head, tiny_target

SWAP_ATTRIBUTES = {RECORD, "forward", "forms", "packed_weight", "shared_product", "shared_index"}


@pytest.fixture
def always_fuse(monkeypatch):
    monkeypatch.setattr(dp, "FUSE_GAIN", 0.0)


def packed_linear() -> nn.Linear:
    torch.manual_seed(0)
    linear = nn.Linear(32, 96)
    speed_up(linear, force="packed")
    assert form_of(linear, many=True) == "packed"
    return linear


def swapped(module: nn.Module) -> list[nn.Module]:
    return [m for m in module.modules() if SWAP_ATTRIBUTES & set(m.__dict__)]


def logits(model: nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits


def test_restore_undoes_the_readout_the_decoder_and_the_heads_lm_head(always_fuse) -> None:
    target = tiny_target("llama")
    head = tiny_head("eagle3", target)  # with its own lm_head
    expected = logits(target, [3, 1, 4, 1, 5])
    speed_up_readout(target, force="packed")
    dp.speed_up_decoder(target, {}, pack=True)
    speed_up(head.lm_head, force="packed")
    assert swapped(target) and swapped(head)
    assert restore(target, head) > 0
    assert swapped(target) == [] and swapped(head) == []
    torch.testing.assert_close(logits(target, [3, 1, 4, 1, 5]), expected)


def test_a_cast_after_the_swap_falls_back_to_the_stock_form() -> None:
    linear = packed_linear()
    linear.to(torch.bfloat16)
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    with torch.inference_mode():
        got = linear(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, F.linear(x, linear.weight, linear.bias))
    assert form_of(linear, many=True) == "stock" and swapped(linear) == []


def test_a_round_trip_cast_is_not_mistaken_for_the_packed_weight() -> None:
    """float32 -> bfloat16 -> float32 rounds the values; the packed copy holds the old ones."""
    linear = packed_linear()
    linear.to(torch.bfloat16).to(torch.float32)
    x = torch.randn(3, 32)
    with torch.inference_mode():
        got = linear(x)
    assert torch.equal(got, F.linear(x, linear.weight, linear.bias))
    assert swapped(linear) == []


def test_an_in_place_update_falls_back_to_the_stock_form() -> None:
    linear = packed_linear()
    with torch.no_grad():
        linear.weight.mul_(2.0)
    x = torch.randn(5, 32)
    with torch.inference_mode():
        got = linear(x)
    torch.testing.assert_close(got, F.linear(x, linear.weight, linear.bias))
    assert swapped(linear) == []


def test_load_state_dict_after_the_swap_is_seen() -> None:
    linear = packed_linear()
    state = {name: value * 3.0 for name, value in linear.state_dict().items()}
    linear.load_state_dict(state)
    x = torch.randn(2, 32)
    with torch.inference_mode():
        torch.testing.assert_close(linear(x), F.linear(x, state["weight"], state["bias"]))


def test_an_in_place_update_of_a_fused_packed_member_undoes_its_group(always_fuse) -> None:
    model = tiny_target("qwen2")  # q/k/v with biases
    attention = model.model.layers[0].self_attn
    members = (attention.q_proj, attention.k_proj, attention.v_proj)
    packed = {dp.group_name(list(members)): {False: "packed", True: "packed"}}
    dp.speed_up_decoder(model, packed, pack=True)
    assert all("shared_product" in m.__dict__ for m in members)
    product = attention.q_proj.shared_product.product
    assert form_of(product, many=True) == "packed"
    with torch.no_grad():
        attention.k_proj.weight.mul_(2.0)
    x = torch.randn(1, 3, model.config.hidden_size)
    with torch.inference_mode():
        got = [member(x) for member in members]
    for member, out in zip(members, got):
        torch.testing.assert_close(out, F.linear(x, member.weight, member.bias))
    assert not any("shared_product" in m.__dict__ for m in members)


def test_a_device_move_after_the_swap_is_seen(always_fuse) -> None:
    """A move to another device gives the weight new storage, as this clone does."""
    model = tiny_target("llama")
    speed_up_readout(model, force="packed")
    readout = model.get_output_embeddings()
    readout.weight.data = readout.weight.data.clone()  # what .to(device) does to the storage
    x = torch.randn(2, model.config.hidden_size)
    with torch.inference_mode():
        torch.testing.assert_close(readout(x), F.linear(x, readout.weight))
    assert form_of(readout, many=True) == "stock"
