"""Int8 linears that are fast on CPUs and exact across batch sizes (``--quantize int8``).

Each weight row (output channel) is stored as int8 with its own float scale and multiplied by
fbgemm's int8 kernel (torch's x86 quantized engine) on a matrix packed once at load.

Exactness across batch sizes: tree verification multiplies many rows at once and plain steps one
row, and a row's result must not depend on which other rows came with it, or EAGLE would stop
being lossless against vanilla decoding of the same int8 model. A dynamic int8 product picks one
activation scale from the whole input's range, so the rows interact. Here each input row is
first divided by its own largest magnitude, so every row lies in [-1, 1], and the kernel
quantizes all rows with one fixed scale and zero point (``activation_range()``);
the product sums exact integers, and the row's magnitude is multiplied back on the float output
(the bias added after). Nothing in a row's arithmetic depends on another row.

Linears that read the same input (an attention's q/k/v, a gated MLP's gate/up: ``SIBLINGS``)
share one packed matrix (``Int8Product``): one pass over the activations and one kernel call
serve them all, each taking its slice. The members share their smoothing (below), since they
share their quantized input. Each swapped linear keeps its own int8 values as its ``weight`` (a
tied weight stays float: the embedding reads it). The swap goes through linear_swaps.py:
restorable (the weights come back as float), and refusing casts, moves and in-place updates,
which would leave the packed matrix stale.

Precision: a row quantized by its one peak spends its 8 bits on a few large channels and rounds
the rest coarsely, in weights (per output row) and activations (per input row) alike. Two fixed
transforms keep the bulk fine while changing nothing about exactness:
- smoothing: each input channel gets a constant factor, multiplied into the weight's column
  before quantization and divided out of the input (SmoothQuant); the factor balances the
  column's weight peak against the channel's input peak from a calibration pass
  (:func:`input_peaks`), or against 1 without one;
- spikes: each input row is clipped at ``SPIKE_SHARE`` of its peak and quantized by that bound;
  what sticks out of the clip (a few channels) goes in a second row, quantized by its own peak.
  Both rows go through the same kernel call and their outputs are added: each depends on its
  row alone.

Integer ranges: with VNNI, fbgemm sums each product in 32 bits, and weights and activations get
all 8 bits. Without it (AVX2, early AVX-512) the kernel adds pairs of products in saturating 16
bits, which full-range rows overflow, so there activations get 7 bits (``activation_range``).
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

import torch
from torch import nn

from backend.engine import linear_swaps
from backend.engine.exact_attention import use_exact_attention
from models.features import decoder_of

WEIGHT_LEVELS = 127  # int8 weights in [-127, 127]: symmetric, one scale per row


@dataclass(frozen=True, slots=True)
class ActivationRange:
    """How the kernel quantizes an input row divided by its peak (in [-1, 1]): to
    ``zero_point + round(x / scale)``, uint8 as fbgemm's activations are."""

    scale: float
    zero_point: int

    def to_json(self) -> list[float]:
        return [self.scale, self.zero_point]


FULL_RANGE = ActivationRange(1.0 / 127, 128)  # into [1, 255]
PAIR_SAFE_RANGE = ActivationRange(1.0 / 64, 64)  # into [0, 128]: 2 * 128 * WEIGHT_LEVELS < 2**15
SMOOTHING = 0.5  # a channel's range goes to inputs and weights as peak**a and peak**(1-a)
SPIKE_SHARE = 1 / 8  # inputs are clipped at this share of their row's peak; the excess gets a row
TINY = torch.finfo(torch.float32).tiny  # the peak of an all-zero row (any positive value works)
CHUNK_ROWS = 16384  # weight rows quantized at once: a large readout never needs a float copy
ENGINE = "x86"  # torch's quantized engine whose linear runs on fbgemm
SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # read one input


def available() -> bool:
    """Whether this torch build has the fbgemm int8 linear (x86 CPUs)."""
    return ENGINE in torch.backends.quantized.supported_engines


@functools.cache
def activation_range() -> ActivationRange:
    """FULL_RANGE where this CPU's kernel sums products exactly; PAIR_SAFE_RANGE where it adds
    pairs of products in saturating 16 bits (fbgemm without VNNI: AVX2, early AVX-512), which
    full-range rows overflow. Asked of the kernel itself: a row of activations at their peak
    read by weights at theirs sums to exactly ``columns * WEIGHT_LEVELS`` or it saturated."""
    columns = 64
    packed = pack(torch.full((8, columns), WEIGHT_LEVELS, dtype=torch.int8), torch.ones(8))
    out = _kernel(torch.ones(1, columns), FULL_RANGE, packed)
    exact = torch.allclose(out, torch.full_like(out, float(columns * WEIGHT_LEVELS)), rtol=1e-4)
    return FULL_RANGE if exact else PAIR_SAFE_RANGE


def _kernel(
    rows: torch.Tensor, inputs: ActivationRange, packed: torch.ScriptObject
) -> torch.Tensor:
    """fbgemm's product of float rows in [-1, 1], quantized with ``inputs``' fixed scale."""
    return torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
        rows, inputs.scale, inputs.zero_point, packed
    )


def smoothing_factors(weights: list[torch.Tensor], input_peak: torch.Tensor | None) -> torch.Tensor:
    """Per input channel, the factor the weight columns of every linear reading that input are
    multiplied by (and the input divided by): channels whose inputs run large lend range to
    their weights, and small columns grow."""
    columns = torch.zeros(weights[0].shape[1], dtype=torch.float32)
    with torch.no_grad():
        for weight in weights:
            for start in range(0, weight.shape[0], CHUNK_ROWS):
                rows = weight[start : start + CHUNK_ROWS].float().abs().amax(dim=0)
                columns = torch.maximum(columns, rows)
    inputs = torch.ones_like(columns) if input_peak is None else input_peak.float()
    factors = inputs.clamp(min=1e-5) ** SMOOTHING / columns.clamp(min=1e-5) ** (1 - SMOOTHING)
    return factors.clamp(min=1e-5)


def quantize_rows(
    weight: torch.Tensor, factors: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 values [N, K], float32 scales [N]) of ``weight * factors`` (columns scaled): each
    row scaled so its peak is WEIGHT_LEVELS."""
    values = torch.empty(weight.shape, dtype=torch.int8)
    scales = torch.empty(weight.shape[0], dtype=torch.float32)
    with torch.no_grad():
        for start in range(0, weight.shape[0], CHUNK_ROWS):
            rows = weight[start : start + CHUNK_ROWS].float()
            if factors is not None:
                rows = rows * factors
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


def int8_product(
    x: torch.Tensor,
    packed: torch.ScriptObject,
    divisors: torch.Tensor | None = None,
    spikes: bool = False,
) -> torch.Tensor:
    """``x [M, K] float32 @ W.T`` through the packed int8 matrix, each row on its own:
    ``divisors`` undo the weight's smoothing; ``spikes`` quantizes a row's large values apart."""
    x = x * divisors if divisors is not None else x.clone()  # a copy: it is divided in place
    peak = x.abs().amax(dim=-1, keepdim=True).clamp_(min=TINY)  # a max is exact in any order
    inputs = activation_range()
    if not spikes:
        return _kernel(x.div_(peak), inputs, packed).mul_(peak)
    # the row clipped to +-bound, quantized by bound; what sticks out, quantized by its own peak
    bound = peak * SPIKE_SHARE
    clipped = torch.clamp(x, -bound, bound)
    bounds = torch.cat([bound, peak - bound])
    both = torch.cat([clipped, x.sub_(clipped)]).div_(bounds)
    out = _kernel(both, inputs, packed).mul_(bounds)
    rows = x.shape[0]
    return out[:rows].add_(out[rows:])


class Int8Product:
    """One packed int8 matrix for linears that read the same input: the first member's call
    computes every member's rows and hands the others their slices for their calls on that very
    tensor (linear_swaps.Handout); any other call computes the whole product afresh, which
    gives the same bits (each output element depends on its input row and weight row alone)."""

    def __init__(
        self, packed: torch.ScriptObject, divisors: torch.Tensor, sizes: list[int], spikes: bool
    ) -> None:
        self.packed = packed
        self.divisors = divisors
        self.spikes = spikes
        self.handout = linear_swaps.Handout(sizes)

    def output(self, index: int, x: torch.Tensor) -> torch.Tensor:
        kept = self.handout.take(index, x)
        if kept is not None:
            return kept
        rows = x.numel() // x.shape[-1]
        flat = x.reshape(rows, x.shape[-1]).float()
        out = int8_product(flat, self.packed, self.divisors, self.spikes)
        return self.handout.keep(index, x, out.reshape(*x.shape[:-1], out.shape[-1]))


def int8_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """The swapped forward: any leading shape, float32 activations."""
    out = self.int8_product.output(self.int8_index, x)
    if self.bias is not None:
        out = out + self.bias
    return out.to(x.dtype)


def quantize_linears(
    members: list[nn.Linear],
    weights: list[torch.Tensor] | None = None,
    tied: bool = False,
    input_peak: torch.Tensor | None = None,
    spikes: bool = True,
) -> None:
    """Swap ``members`` (linears that read the same input, or one linear) to their int8 form
    with one shared product, quantized from ``weights`` (default: their own; pass the float
    tensors when theirs are still on ``meta`` or already int8). ``tied``: a single member's
    weight is shared with another module (the embedding) and stays float; otherwise each weight
    becomes its int8 values. ``input_peak``: the input's per-channel peaks from calibration,
    for the smoothing. ``spikes``: quantize large input values in a row of their own (a readout
    skips it: its product is the largest, and most of the gain is in the decoder)."""
    for linear in members:
        linear_swaps.unswap(linear)  # a re-quantization starts from the float form
    sources = [
        (linear.weight if weights is None else weight).detach()
        for linear, weight in zip(members, weights or members)
    ]
    factors = smoothing_factors(sources, input_peak)
    quantized = [quantize_rows(source, factors) for source in sources]
    if len(quantized) == 1:  # a readout's values are not copied once more
        packed = pack(*quantized[0])
    else:
        packed = pack(*(torch.cat(parts) for parts in zip(*quantized)))
    product = Int8Product(packed, 1.0 / factors, [len(scale) for _, scale in quantized], spikes)
    for index, (linear, (values, scales)) in enumerate(zip(members, quantized)):
        if not tied:
            linear.weight = nn.Parameter(values, requires_grad=False)
        attributes = {
            "int8_product": product,
            "int8_index": index,
            "int8_scale": scales,
            "int8_divisors": product.divisors,
        }
        linear_swaps.swap(
            linear,
            int8_forward,
            attributes,
            copies=True,
            refuse_changes=True,
            undo=None if tied else _dequantize,
        )
    linear_swaps.group(members)


def _dequantize(linear: nn.Linear) -> None:
    """The undo of an untied int8 swap: float32 weights from the int8 values, their row scales
    and the columns' smoothing."""
    scale = linear.__dict__.get("int8_scale")
    divisors = linear.__dict__.get("int8_divisors")
    weight = linear.weight
    if scale is None or weight.dtype != torch.int8:
        return
    restored = weight.float() * scale[:, None] * divisors[None, :]
    linear.weight = nn.Parameter(restored, requires_grad=False)


def input_peaks(
    model: nn.Module, linears: list[nn.Linear], calibration: list[list[int]]
) -> dict[nn.Linear, torch.Tensor]:
    """Each linear's largest input magnitude per channel while ``model`` reads each token
    sequence of ``calibration`` (each one from its start, as prompts are read)."""
    peaks: dict[nn.Linear, torch.Tensor] = {}

    def record(module: nn.Module, args: tuple) -> None:
        seen = args[0].detach().abs().reshape(-1, args[0].shape[-1]).amax(dim=0).float()
        known = peaks.get(module)
        peaks[module] = seen if known is None else torch.maximum(known, seen)

    hooks = [linear.register_forward_pre_hook(record) for linear in linears]
    try:
        with torch.inference_mode():
            for token_ids in calibration:
                model(input_ids=torch.tensor([token_ids]), use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    return peaks


def is_int8(linear: nn.Module) -> bool:
    record = linear_swaps.record_of(linear)
    return record is not None and record.forward is int8_forward


def product_groups(model: nn.Module) -> list[list[nn.Linear]]:
    """The linears an int8 target quantizes, as the products they share: per decoder layer its
    SIBLINGS groups and every other linear alone, then the readout (last)."""
    groups: list[list[nn.Linear]] = []
    for layer in decoder_of(model).layers:
        grouped: set[nn.Module] = set()
        for module in layer.modules():
            for names in SIBLINGS:
                members = [getattr(module, name, None) for name in names]
                if all(type(m) is nn.Linear for m in members) and (
                    len({m.in_features for m in members}) == 1
                ):
                    groups.append(members)
                    grouped.update(members)
        groups += [[m] for m in layer.modules() if type(m) is nn.Linear and m not in grouped]
    return [*groups, [model.get_output_embeddings()]]


def quantized_linears(model: nn.Module) -> list[nn.Linear]:
    """The linears an int8 target quantizes: the decoder layers' and the readout (last)."""
    return [linear for group in product_groups(model) for linear in group]


def group_peak(
    members: list[nn.Linear], peaks: dict[nn.Linear, torch.Tensor]
) -> torch.Tensor | None:
    """The input peaks of linears that read one input (each saw the same, so any will do)."""
    seen = [peaks[linear] for linear in members if linear in peaks]
    return torch.stack(seen).amax(dim=0) if seen else None


def quantize_model(model: nn.Module, calibration: list[list[int]] | None = None) -> int:
    """Every float ``nn.Linear`` of the decoder layers and the readout in int8 (a readout tied
    to the embedding keeps its float weight, which the embedding reads), and attention that is
    exact across batch sizes too (exact_attention.py). With ``calibration`` (token sequences),
    the smoothing uses input peaks measured by the int8 model itself reading them, as a
    tensor-by-tensor load does (int8_loading.py), so both give the same weights. Returns how
    many linears."""
    use_exact_attention(model)
    readout = model.get_output_embeddings()
    tied = readout.weight is model.get_input_embeddings().weight
    groups = [
        group
        for group in product_groups(model)[:-1]
        if all(linear.weight.is_floating_point() for linear in group)
    ]
    floats = {linear: linear.weight for linear in [*sum(groups, []), readout]}

    def quantize_all(peaks: dict[nn.Linear, torch.Tensor]) -> None:
        for group in groups:
            weights = [floats[linear] for linear in group]
            quantize_linears(group, weights, input_peak=group_peak(group, peaks))
        quantize_linears(
            [readout], [floats[readout]], tied, input_peak=peaks.get(readout), spikes=False
        )

    quantize_all({})
    if calibration:
        quantize_all(input_peaks(model, [*floats], calibration))
    return len(floats)
