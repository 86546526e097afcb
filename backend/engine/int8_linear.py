"""Int8 linears that are fast on CPUs and exact across batch sizes (``--quantize int8``).

Each weight row (output channel) is stored as int8 with its own float scale and multiplied by
fbgemm's int8 kernel (torch's x86 quantized engine) on a matrix packed once at load.

Exactness across batch sizes: tree verification multiplies many rows at once and plain steps one
row, and a row's result must not depend on which other rows came with it, or EAGLE would stop
being lossless against vanilla decoding of the same int8 model. A dynamic int8 product picks one
activation scale from the whole input's range, so the rows interact. Here each input row is
first divided by its own largest magnitude, so every row lies in [-1, 1], and the kernel
quantizes all rows with one fixed scale and zero point (``ACTIVATION_SCALE``, ``ZERO_POINT``);
the product sums exact integers, and the row's magnitude is multiplied back on the float output
(the bias added after). Nothing in a row's arithmetic depends on another row.

Each swapped linear keeps its int8 values as its ``weight`` (a tied weight stays float: the
embedding reads it) and the packed matrix beside it (``int8_weight``). The swap goes through
linear_swaps.py: restorable (the weights come back as float), and refusing casts, moves and
in-place updates, which would leave the packed matrix stale.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from backend.engine import linear_swaps
from backend.engine.exact_attention import use_exact_attention
from models.features import decoder_of

WEIGHT_LEVELS = 127  # int8 weights in [-127, 127]: symmetric, one scale per row
ACTIVATION_SCALE = 1.0 / 127  # an input row divided by its peak lies in [-1, 1] ...
ZERO_POINT = 128  # ... and quantizes to [1, 255] (uint8, as fbgemm's activations are)
CHUNK_ROWS = 16384  # weight rows quantized at once: a large readout never needs a float copy
ENGINE = "x86"  # torch's quantized engine whose linear runs on fbgemm


def available() -> bool:
    """Whether this torch build has the fbgemm int8 linear (x86 CPUs)."""
    return ENGINE in torch.backends.quantized.supported_engines


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 values [N, K], float32 scales [N]): each row scaled so its peak is WEIGHT_LEVELS."""
    values = torch.empty(weight.shape, dtype=torch.int8)
    scales = torch.empty(weight.shape[0], dtype=torch.float32)
    with torch.no_grad():
        for start in range(0, weight.shape[0], CHUNK_ROWS):
            rows = weight[start : start + CHUNK_ROWS].float()
            scale = rows.abs().amax(dim=1) / WEIGHT_LEVELS
            scale = torch.where(scale > 0, scale, torch.ones_like(scale))
            values[start : start + CHUNK_ROWS] = torch.round(rows / scale[:, None]).to(torch.int8)
            scales[start : start + CHUNK_ROWS] = scale
    return values, scales


def pack(values: torch.Tensor, scales: torch.Tensor) -> torch.ScriptObject:
    """fbgemm's packed form of int8 rows with per-row scales (no bias: it is added in float)."""
    torch.backends.quantized.engine = ENGINE
    zeros = torch.zeros(values.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # quantized tensors are deprecated; the kernel is not
        warnings.simplefilter("ignore")
        quantized = torch._make_per_channel_quantized_tensor(values, scales.double(), zeros, 0)
        return torch.ops.quantized.linear_prepack(quantized, None)


def int8_product(x: torch.Tensor, packed: torch.ScriptObject) -> torch.Tensor:
    """``x [M, K] float32 @ W.T`` through the packed int8 matrix, each row on its own."""
    peak = x.abs().amax(dim=-1, keepdim=True)  # [M, 1]
    peak = torch.where(peak > 0, peak, torch.ones_like(peak))
    out = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
        x / peak, ACTIVATION_SCALE, ZERO_POINT, packed
    )
    return out.mul_(peak)


def int8_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """The swapped forward: any leading shape, float32 activations."""
    rows = x.numel() // x.shape[-1]
    out = int8_product(x.reshape(rows, x.shape[-1]).float(), self.int8_weight)
    if self.bias is not None:
        out = out.add_(self.bias)
    return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


def quantize_linear(
    linear: nn.Linear, weight: torch.Tensor | None = None, tied: bool = False
) -> None:
    """Swap ``linear`` to its int8 form, quantized from ``weight`` (default: its own; pass the
    float tensor when ``linear``'s is still on ``meta``). ``tied``: its weight is shared with
    another module (the embedding) and stays float; otherwise it becomes the int8 values."""
    source = linear.weight if weight is None else weight
    values, scales = quantize_rows(source.detach())
    packed = pack(values, scales)
    if not tied:
        linear.weight = nn.Parameter(values, requires_grad=False)
    attributes = {"int8_weight": packed, "int8_scale": scales}
    linear_swaps.swap(
        linear,
        int8_forward,
        attributes,
        copies=True,
        refuse_changes=True,
        undo=None if tied else _dequantize,
    )


def _dequantize(linear: nn.Linear) -> None:
    """The undo of an untied int8 swap: float32 weights from the int8 values and their scales."""
    scale = linear.__dict__.get("int8_scale")
    weight = linear.weight
    if scale is None or weight.dtype != torch.int8:
        return
    linear.weight = nn.Parameter(weight.float() * scale[:, None], requires_grad=False)


def is_int8(linear: nn.Module) -> bool:
    record = linear_swaps.record_of(linear)
    return record is not None and record.forward is int8_forward


def quantize_model(model: nn.Module) -> int:
    """Every float ``nn.Linear`` of the decoder layers and the readout in int8 (a readout tied
    to the embedding keeps its float weight, which the embedding reads), and attention that is
    exact across batch sizes too (exact_attention.py). Returns how many linears."""
    use_exact_attention(model)
    readout = model.get_output_embeddings()
    tied = readout.weight is model.get_input_embeddings().weight
    linears = [
        module
        for layer in decoder_of(model).layers
        for module in layer.modules()
        if type(module) is nn.Linear and module.weight.is_floating_point()
    ]
    for linear in linears:
        quantize_linear(linear)
    quantize_linear(readout, tied=tied)
    return len(linears) + 1
