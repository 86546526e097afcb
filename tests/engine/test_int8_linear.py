"""The int8 form of the target's linears (int8_linear.py): a row's output is bit-identical alone
and inside batches of 8 and 32, close to the float product, and the swap is restorable and
refuses casts, moves and in-place updates."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from backend.engine import int8_linear
from backend.engine.int8_linear import int8_forward, is_int8, quantize_linears, quantize_model
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
    quantize_linears([linear])
    assert linear.weight.dtype == torch.int8
    with torch.inference_mode():
        got = linear(x)
    error = (got - expected).norm() / expected.norm()
    assert error < 0.02, error


@pytest.mark.parametrize("spikes", [False, True])
def test_the_product_is_the_integer_arithmetic_with_nothing_overflowing(spikes: bool) -> None:
    """The kernel's output equals the same rounding done in float64 (rows at their peak, weights
    at theirs): on a CPU whose kernel saturates 16-bit pair sums, ranges that overflow would
    miss by far more than float rounding."""
    inputs = int8_linear.activation_range()
    generator = torch.Generator().manual_seed(4)
    weight = torch.randn(64, 512, generator=generator)
    weight[:, ::2] = weight[:, ::2].sign() * weight.abs().amax()  # every other column at its peak
    x = torch.randn(8, 512, generator=generator)
    x[:, :2] = 40.0  # a pair of channels at the row's peak, as saturation needs
    values, scales = int8_linear.quantize_rows(weight)
    got = int8_linear.int8_product(x, int8_linear.pack(values, scales), spikes=spikes)

    def integer_product(rows: torch.Tensor) -> torch.Tensor:
        peak = rows.abs().amax(dim=-1, keepdim=True)
        levels = torch.round(rows / peak / inputs.scale).clamp(
            -inputs.zero_point, 255 - inputs.zero_point
        )
        out = levels.double() @ values.double().T
        return out * inputs.scale * scales.double() * peak.double()

    if spikes:
        bound = x.abs().amax(dim=-1, keepdim=True) * int8_linear.SPIKE_SHARE
        clipped = x.clamp(-bound, bound)
        expected = integer_product(clipped) + integer_product(x - clipped)
    else:
        expected = integer_product(x)
    assert torch.allclose(got.double(), expected, rtol=1e-4, atol=1e-3 * expected.abs().max())


def test_restore_gives_back_the_float_weight_up_to_rounding() -> None:
    torch.manual_seed(1)
    linear = nn.Linear(128, 64)
    original = linear.weight.detach().clone()
    quantize_linears([linear], input_peak=torch.rand(128) * 10)
    # half a rounding step of the smoothed row, divided back by the column's factor
    bound = linear.int8_scale[:, None] / 2 * linear.int8_divisors[None, :] * (1 + 1e-5)
    restore(linear)
    assert ((linear.weight - original).abs() <= bound).all()
    assert not torch.equal(linear.weight, original)


def rows_with_outlier_channels(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(inputs [16, 256] whose channels 3 and 70 run 60x larger, as in real decoders, their
    per-channel peaks, a weight [512, 256])."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 256, generator=generator)
    x[:, [3, 70]] *= 60.0
    weight = torch.randn(512, 256, generator=generator) / 16
    return x, x.abs().amax(dim=0), weight


def product_error(x: torch.Tensor, weight: torch.Tensor, **how) -> float:
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    linear.weight.data.copy_(weight)
    expected = x @ weight.T
    quantize_linears([linear], **how)
    with torch.inference_mode():
        return float((linear(x) - expected).norm() / expected.norm())


def test_smoothing_and_spikes_each_make_outlier_channels_cheaper() -> None:
    x, peaks, weight = rows_with_outlier_channels(seed=5)
    plain = product_error(x, weight, spikes=False)
    smoothed = product_error(x, weight, input_peak=peaks, spikes=False)
    both = product_error(x, weight, input_peak=peaks, spikes=True)
    assert smoothed < 0.7 * plain, (smoothed, plain)
    assert both < smoothed, (both, smoothed)
    assert product_error(x, weight, spikes=True) < 0.7 * plain


def test_input_peaks_are_each_channel_s_largest_input_over_every_sequence() -> None:
    model = tiny_target("llama", num_layers=2)
    quantize_model(model)
    linear = model.model.layers[1].mlp.down_proj
    seen: list[torch.Tensor] = []
    hook = linear.register_forward_pre_hook(lambda module, args: seen.append(args[0][0]))
    sequences = [[1, 5, 9, 2], [7, 7, 3]]
    peaks = int8_linear.input_peaks(model, [linear], sequences)
    hook.remove()
    assert len(seen) == 2
    assert torch.equal(peaks[linear], torch.cat(seen).abs().amax(dim=0))


def test_calibration_sets_the_smoothing_and_keeps_rows_exact() -> None:
    plain, calibrated = tiny_target("mistral", num_layers=2), tiny_target("mistral", num_layers=2)
    quantize_model(plain)
    quantize_model(calibrated, calibration=[[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8]])
    q_plain = plain.model.layers[0].self_attn.q_proj
    q_calibrated = calibrated.model.layers[0].self_attn.q_proj
    assert not torch.equal(q_plain.int8_divisors, q_calibrated.int8_divisors)
    for index, linear in enumerate(m for m in calibrated.modules() if is_int8(m)):
        assert_rows_exact(linear, rows_to_check(linear.in_features, seed=100 + index))


def test_a_tied_readout_keeps_its_float_weight_and_restore_brings_back_float() -> None:
    model = tiny_target("llama")
    model.lm_head.weight = model.get_input_embeddings().weight  # tied, as in Gemma
    quantize_model(model)
    assert model.lm_head.weight.dtype == torch.float32 and is_int8(model.lm_head)
    down = model.model.layers[0].mlp.down_proj
    values, scale, divisors = down.weight.clone(), down.int8_scale, down.int8_divisors
    assert values.dtype == torch.int8
    assert restore(model) == 7 * model.config.num_hidden_layers + 1
    assert not any(is_int8(m) or "int8_product" in m.__dict__ for m in model.modules())
    assert down.weight.dtype == torch.float32
    torch.testing.assert_close(down.weight, values.float() * scale[:, None] * divisors[None, :])
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


def test_siblings_share_one_product_and_each_gets_the_bits_it_gets_alone(monkeypatch) -> None:
    """q/k/v and gate/up read one input: one packed matrix and one kernel call serve them all
    (the first call keeps the others' slices for that very tensor), and what a member is served
    equals what it computes alone on a copy of the input, bit for bit."""
    model = tiny_target("qwen2", num_layers=1)  # q/k/v with biases
    quantize_model(model)
    attention, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    qkv = [attention.q_proj, attention.k_proj, attention.v_proj]
    assert len({id(linear.int8_product) for linear in qkv}) == 1
    assert mlp.gate_proj.int8_product is mlp.up_proj.int8_product
    assert mlp.down_proj.int8_product is not mlp.up_proj.int8_product
    x = rows_to_check(attention.q_proj.in_features, seed=11)[None, :8]
    with torch.inference_mode():
        alone = [linear(x.clone()) for linear in qkv]
        calls = []
        product = int8_linear.int8_product
        monkeypatch.setattr(
            int8_linear, "int8_product", lambda *args: calls.append(1) or product(*args)
        )
        served = [linear(x) for linear in qkv]
    assert len(calls) == 1
    for got, expected in zip(served, alone):
        assert torch.equal(got, expected)
    assert restore(model) == 7 + 1
