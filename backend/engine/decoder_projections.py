"""The target's decoder projections, faster at inference while the model stays a stock
transformers model with the same parameters:
- linears that read the same tensor (an attention's q/k/v, a gated MLP's gate/up) run as one
  product (``StackedLinears``: their weights re-seated as blocks of one matrix, no copy);
- every projection shape runs in the fastest CPU form timed at load (projection_forms.py),
  timed once per shape and applied to every layer.

transformers calls q_proj, k_proj and v_proj one after another on the same hidden states, so
each member's ``forward`` is replaced: the first call computes the stacked product and keeps
the other members' slices (per thread) for their calls on that very tensor; any other call,
or one with gradients on, computes its own product. A probe forward before and after the swap
must agree, or the swap is undone.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from backend.engine import linear_swaps
from backend.engine.device import now
from backend.engine.projection_forms import FORMS, Forms, speed_up, swappable
from models.features import decoder_of
from models.heads.base import execution_device
from models.stacked_linears import StackedLinears

logger = logging.getLogger(__name__)

SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
PROBE_TOKENS = 5
FUSE_GAIN = 1.05  # a fused group must be timed at least this much faster than its members
# rows timed per case: one row (plain steps), several (chain- and tree-sized verifications)
TIMING_ROWS = {False: (1,), True: (4, 8, 16)}
TIMING_CALLS = 7
UNFUSED: Forms = {False: "unfused", True: "unfused"}  # a group left as its own linears, for
# one row and for several (a group may also be fused for several rows only)


class SharedProduct:
    """One stacked product that serves each of its member linears its own slice."""

    def __init__(self, stack: StackedLinears) -> None:
        self.stack = stack
        self.handout = linear_swaps.Handout([linear.out_features for linear in stack.linears])
        self.product = _linear_over(stack)  # shares the stacked storage
        self.fused_rows = {False: True, True: True}  # one row / several: through the product?

    def output(self, index: int, x: torch.Tensor) -> torch.Tensor:
        kept = self.handout.take(index, x)
        if kept is not None:
            return kept
        many = x.numel() > x.shape[-1]
        if not self.fused_rows[many] or torch.is_grad_enabled() or not self.stack.fused:
            self.handout.forget()
            member = self.stack.linears[index]
            return F.linear(x, member.weight, member.bias)
        product = self.product
        forms = getattr(product, "forms", None)  # the form for one row or several, if any
        if forms is None:
            out = F.linear(x, product.weight, product.bias)
        else:
            out = forms[many](product, x)
        return self.handout.keep(index, x, out)


def _member_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return self.shared_product.output(self.shared_index, x)


def _linear_over(stack: StackedLinears) -> nn.Linear:
    """An ``nn.Linear`` whose weight (and bias) is the stack's matrix itself, so the product
    can take a CPU form like any linear."""
    weight, bias = stack.weight, stack.bias
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    linear.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        linear.bias = nn.Parameter(bias, requires_grad=False)
    return linear


def speed_up_decoder(model: nn.Module, known: dict[str, Forms], pack: bool) -> dict[str, Forms]:
    """Fuse the sibling projections of every decoder layer where that pays and give each
    projection shape its form (``known`` from an earlier load of this pair, else timed on the
    first layer; ``pack`` False allows no packed copy of the weights). Returns the choices by
    name (``"decoder 320x192"`` for a linear or a fused product, ``"decoder q_proj+k_proj+v_proj
    320x192"`` for a group: its product's forms or UNFUSED), empty when nothing changed or the
    probe disagreed."""
    layers = list(decoder_of(model).layers)
    if not any(_stackable(linear) for linear in _linears(layers)):
        return {}
    before = _probe(model)
    forms: dict[str, Forms] = {}
    for members in _sibling_groups(layers):
        name = group_name(members)
        forms[name] = _fuse_if_it_pays(members, known.get(name) or forms.get(name), forms, pack)
    for linear in _linears(layers):
        if "shared_product" not in linear.__dict__:
            _give_forms(linear, known, forms, pack)
    try:
        agrees = _close(before, _probe(model))
    except RuntimeError as error:
        logger.warning("fused decoder projections failed a probe forward: %s", error)
        agrees = False
    if not agrees:
        logger.warning("the fused decoder projections changed the outputs: undone")
        for linear in _linears(layers):
            linear_swaps.unswap(linear)
        return {}
    return forms


def _fuse_if_it_pays(
    members: list[nn.Linear], choice: Forms | None, forms: dict[str, Forms], pack: bool
) -> Forms:
    """Run ``members`` as one product with the ``choice`` of forms (``"unfused"`` for one row or
    for several: the members run alone there); with no choice yet, for one row and for several
    only where that is timed at least FUSE_GAIN times faster than the members in their own
    forms. Returns the product's forms per case, or UNFUSED."""
    if choice == UNFUSED:
        return UNFUSED
    if choice is None:
        for member in members:
            _give_forms(member, {}, forms, pack)
        separate = {many: _time_calls(members, rows) for many, rows in TIMING_ROWS.items()}
        for member in members:
            linear_swaps.unswap(member)
    shared = _share(members)
    if shared is None:
        return UNFUSED
    known = None if choice is None else {many: form for many, form in choice.items()}
    if known is not None and "unfused" in known.values():  # the product's form where it runs
        runs = [form for form in known.values() if form != "unfused"]
        known = {many: form if form != "unfused" else runs[0] for many, form in known.items()}
    chosen = speed_up(shared.product, known=known, pack=pack)
    if choice is None:
        for many, rows in TIMING_ROWS.items():
            if FUSE_GAIN * _time_calls(members, rows) > separate[many]:
                chosen[many] = "unfused"
    else:
        chosen = {many: "unfused" if choice[many] == "unfused" else chosen[many] for many in choice}
    if chosen == UNFUSED:
        for member in members:
            linear_swaps.unswap(member)
        return UNFUSED
    shared.fused_rows = {many: form != "unfused" for many, form in chosen.items()}
    for member in members:  # a packed product is a copy: in-place updates make it stale
        linear_swaps.record_of(member).copies = "packed" in chosen.values()
    return chosen


def _give_forms(
    linear: nn.Linear, known: dict[str, Forms], forms: dict[str, Forms], pack: bool
) -> None:
    if not swappable(linear):
        return
    name = shape_name(linear)
    chosen = known.get(name) or forms.get(name)
    forms[name] = speed_up(linear, known=chosen, pack=pack)


def _time_calls(members: list[nn.Linear], row_counts: tuple[int, ...]) -> float:
    """Seconds to call every member on the same input, summed over ``row_counts`` (best of
    several calls each)."""
    weight = members[0].weight
    total = 0.0
    with torch.inference_mode():
        for rows in row_counts:
            x = torch.randn(
                1, rows, members[0].in_features, dtype=weight.dtype, device=weight.device
            )
            best = float("inf")
            for _ in range(TIMING_CALLS):
                start = now(weight.device)
                for member in members:
                    member(x)
                best = min(best, now(weight.device) - start)
            total += best
    return total


def projection_bytes(model: nn.Module) -> int:
    """Bytes of the decoder's linear weights: what a packed copy of them all would add."""
    linears = _linears(list(decoder_of(model).layers))
    return sum(linear.weight.numel() * linear.weight.element_size() for linear in linears)


def shape_name(linear: nn.Linear) -> str:
    bias = "+bias" if linear.bias is not None else ""
    return f"decoder {linear.out_features}x{linear.in_features}{bias}"


def known_decoder_forms(forms: dict[str, Forms]) -> dict[str, Forms]:
    """The decoder entries of cached forms that name real forms."""
    return {
        name: chosen
        for name, chosen in forms.items()
        if name.startswith("decoder ") and set(chosen.values()) <= {*FORMS, "unfused"}
    }


def describe_decoder(forms: dict[str, Forms]) -> str:
    """``"fused gate_proj+up_proj (several rows); 1024x192 stock/packed, ..."`` (each shape's
    form for one row / several), or ``"stock"`` when nothing changed."""
    decoder = {n.removeprefix("decoder "): c for n, c in forms.items() if n.startswith("decoder ")}
    fused = [
        name.split()[0] + _fused_cases(c)
        for name, c in decoder.items()
        if " " in name and c != UNFUSED
    ]
    shapes = [
        f"{name} {c[False]}/{c[True]}" for name, c in sorted(decoder.items()) if " " not in name
    ]
    if not fused and all(shape.endswith("stock/stock") for shape in shapes):
        return "stock"
    return f"fused {', '.join(fused) or 'nothing'}; {', '.join(shapes)}"


def _fused_cases(chosen: Forms) -> str:
    if "unfused" not in chosen.values():
        return ""
    return " (several rows)" if chosen[True] != "unfused" else " (one row)"


def _sibling_groups(layers: list[nn.Module]) -> Iterator[list[nn.Linear]]:
    """Each layer's linears that read the same input (SIBLINGS) and could run as one product."""
    for layer in layers:
        for module in layer.modules():
            for names in SIBLINGS:
                members = [getattr(module, name, None) for name in names]
                if (
                    all(_stackable(m) for m in members)
                    and len({m.in_features for m in members}) == 1
                ):
                    yield members


def _share(members: list[nn.Linear]) -> SharedProduct | None:
    """Members re-seated as one matrix and answering from one shared product; None where they
    cannot be stacked (mixed dtypes or devices, some with bias)."""
    stack = StackedLinears(*members)
    if not stack.fuse():
        return None
    shared = SharedProduct(stack)
    for index, member in enumerate(members):
        attributes = {"shared_product": shared, "shared_index": index}
        linear_swaps.swap(member, _member_forward, attributes, copies=False)
    linear_swaps.group(members)
    return shared


def group_name(members: list[nn.Linear]) -> str:
    names = "+".join(_attribute_names(members))
    out = sum(member.out_features for member in members)
    return f"decoder {names} {out}x{members[0].in_features}"


def _attribute_names(members: list[nn.Linear]) -> list[str]:
    for names in SIBLINGS:
        if len(names) == len(members):
            return list(names)
    return [str(len(members))]


def _linears(layers: list[nn.Module]) -> Iterator[nn.Linear]:
    for layer in layers:
        for module in layer.modules():
            if isinstance(module, nn.Linear):
                yield module


def _stackable(linear: nn.Module | None) -> bool:
    """A plain float linear on a real device whose forward nobody else has replaced."""
    return (
        type(linear) is nn.Linear
        and linear.weight.device.type != "meta"
        and linear.weight.is_floating_point()
        and not hasattr(linear, "_hf_hook")
        and "shared_product" not in linear.__dict__
    )


@torch.inference_mode()
def _probe(model: nn.Module) -> list[torch.Tensor]:
    """Logits of a few tokens and of one token, without a cache: a several-row and a one-row
    forward through every layer."""
    device = execution_device(model.get_input_embeddings())
    vocab = model.get_input_embeddings().weight.shape[0]
    ids = (torch.arange(PROBE_TOKENS, device=device) * 7 + 1) % vocab
    return [model(input_ids=tokens[None], use_cache=False).logits[0] for tokens in (ids, ids[:1])]


def _close(before: list[torch.Tensor], after: list[torch.Tensor]) -> bool:
    """Equal up to rounding (other kernels add in another order), far from a wrong product."""
    for old, new in zip(before, after):
        tolerance = 1e-3 if old.dtype == torch.float32 else 3e-2
        old, new = old.float(), new.float()
        scale = float(old.abs().max()) or 1.0
        if not torch.allclose(new, old, rtol=0.0, atol=tolerance * scale):
            return False
    return True
