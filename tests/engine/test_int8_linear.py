"""The int8 form of the target's linears (int8_linear.py): a row's output is bit-identical alone
and inside batches of 8 and 32, close to the float product, and the swap is restorable and
refuses casts, moves and in-place updates."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from backend.engine import int8_linear
from backend.engine.int8_linear import int8_forward, is_int8, quantize_linear, quantize_model
from backend.engine.linear_swaps import restore
from backend.errors import ConfigError
from tests.factories import tiny_target

pytestmark = pytest.mark.skipif(not int8_linear.available(), reason="no fbgemm in this torch")


def rows_to_check(width: int, seed: int) -> torch.Tensor:
    """32 rows of very different scales: outliers, tiny rows, a zero row, a constant row."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(32, width, generator=generator) * torch.rand(32, 1, generator=generator) * 8
    x[3, :4] *= 50.0  # outlier features
    x[5] *= 1e-6
    x[7] = 0.0
    x[9] = 0.25
    return x


def assert_rows_exact(linear: nn.Linear, x: torch.Tensor) -> None:
    with torch.inference_mode():
        batch32 = linear(x)
        for start in range(0, 32, 8):
            assert torch.equal(linear(x[start : start + 8]), batch32[start : start + 8])
        for row in range(32):
            assert torch.equal(linear(x[row : row + 1])[0], batch32[row]), row
        assert torch.equal(linear(x[None, 4:12])[0], batch32[4:12])  # [1, M, K] as in a tree


def test_every_int8_layer_gives_each_row_the_same_bits_at_1_8_and_32_rows() -> None:
    model = tiny_target("llama")
    quantize_model(model)
    linears = [m for m in model.modules() if is_int8(m)]
    assert len(linears) == 7 * model.config.num_hidden_layers + 1
    for index, linear in enumerate(linears):
        assert_rows_exact(linear, rows_to_check(linear.in_features, seed=index))


def test_each_row_is_exact_on_the_model_s_own_activations() -> None:
    """The inputs the layers really see in a forward (captured by hooks), not just noise."""
    model = tiny_target("mistral", num_layers=2)
    quantize_model(model)
    seen: dict[nn.Module, torch.Tensor] = {}

    def keep(module: nn.Module, args: tuple) -> None:
        seen[module] = args[0][0].clone()

    hooks = [m.register_forward_pre_hook(keep) for m in model.modules() if is_int8(m)]
    with torch.inference_mode():
        model(input_ids=torch.randint(0, 256, (1, 32), generator=torch.Generator().manual_seed(3)))
    for hook in hooks:
        hook.remove()
    assert len(seen) == 7 * 2 + 1
    for linear, x in seen.items():
        assert_rows_exact(linear, x)


def test_the_int8_product_is_close_to_the_float_one() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(256, 512)
    x = torch.randn(16, 256)
    expected = F.linear(x, linear.weight, linear.bias)
    quantize_linear(linear)
    assert linear.weight.dtype == torch.int8
    with torch.inference_mode():
        got = linear(x)
    error = (got - expected).norm() / expected.norm()
    assert error < 0.02, error


def test_a_tied_readout_keeps_its_float_weight_and_restore_brings_back_float() -> None:
    model = tiny_target("llama")
    model.lm_head.weight = model.get_input_embeddings().weight  # tied, as in Gemma
    quantize_model(model)
    assert model.lm_head.weight.dtype == torch.float32 and is_int8(model.lm_head)
    down = model.model.layers[0].mlp.down_proj
    values, scale = down.weight.clone(), down.int8_scale
    assert values.dtype == torch.int8
    assert restore(model) == 7 * model.config.num_hidden_layers + 1
    assert not any(is_int8(m) or "int8_weight" in m.__dict__ for m in model.modules())
    assert down.weight.dtype == torch.float32
    torch.testing.assert_close(down.weight, values.float() * scale[:, None])
    with torch.inference_mode():
        model(input_ids=torch.tensor([[1, 2, 3]]))  # the stock model runs again


def test_casts_and_moves_are_refused() -> None:
    model = tiny_target("llama")
    quantize_model(model)
    with pytest.raises(ConfigError, match="cannot be cast or moved"):
        model.to(torch.bfloat16)
    with pytest.raises(ConfigError, match="cannot be cast or moved"):
        model.model.layers[0].mlp.up_proj.to("meta")
    model.to(torch.float32)  # no change: allowed
    model.to("cpu")


def test_an_in_place_update_is_refused_at_the_next_call() -> None:
    model = tiny_target("llama")
    quantize_model(model)
    gate = model.model.layers[1].mlp.gate_proj
    with torch.no_grad():
        gate.weight.mul_(2)
    with pytest.raises(ConfigError, match="changed or moved"), torch.inference_mode():
        model(input_ids=torch.tensor([[1, 2, 3]]))


def test_a_tied_readout_updated_through_the_embedding_is_refused() -> None:
    model = tiny_target("llama")
    model.lm_head.weight = model.get_input_embeddings().weight
    quantize_model(model)
    model.get_input_embeddings().load_state_dict({"weight": torch.zeros(256, 64)})
    with pytest.raises(ConfigError, match="changed or moved"), torch.inference_mode():
        model(input_ids=torch.tensor([[1, 2, 3]]))


def test_the_swap_is_a_forward_of_the_model_s_own_linear() -> None:
    model = tiny_target("qwen2")  # q/k/v with biases
    q_proj = model.model.layers[0].self_attn.q_proj
    quantize_model(model)
    assert type(q_proj) is nn.Linear and q_proj.forward.__func__ is not nn.Linear.forward
    assert q_proj.__dict__["linear_swap"].forward is int8_forward
    assert q_proj.bias.dtype == torch.float32
