"""Faster CPU forms of the output projections: same numbers as F.linear, same greedy text,
chosen per row count, applied only to plain float Linear layers it may own."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from backend.config import LoadConfig, TreeConfig
from backend.engine.projection_forms import (
    _FORWARDS,
    FORMS,
    choose_forms,
    describe,
    form_of,
    speed_up,
    speed_up_readout,
    swappable,
)
from tests.engine.helpers import make_runner, run
from tests.factories import easy_llama_pair


@pytest.mark.parametrize("form", FORMS)
def test_every_form_equals_f_linear_for_every_row_count_and_shape(form) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(48, 300, bias=True)
    speed_up(linear, force=form)  # packs the weight for the packed form
    with torch.inference_mode():
        for shape in [(1, 48), (2, 48), (7, 48), (1, 5, 48), (2, 3, 48)]:
            x = torch.randn(*shape)
            expected = F.linear(x, linear.weight, linear.bias)
            for ours in (_FORWARDS[form](linear, x), linear(x)):
                assert ours.shape == expected.shape
                torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("form", ["rows-first", "packed"])
def test_forced_forms_keep_greedy_eagle_identical_to_vanilla(form) -> None:
    target, head = easy_llama_pair()
    forms = speed_up_readout(target, force=form)
    readout = target.get_output_embeddings()
    assert form_of(readout, many=True) == form == forms[True]
    assert form_of(readout, many=False) == ("stock" if form == "rows-first" else form)
    runner, drafter = make_runner(target, head)
    prompt = [3, 1, 4, 1, 5]
    tree = TreeConfig(total_tokens=12, depth=5, top_k=3)
    eagle, _ = run(runner, drafter, prompt, mode="eagle", max_new_tokens=60, tree=tree)
    vanilla, _ = run(runner, drafter, prompt, mode="vanilla", max_new_tokens=60)
    assert eagle.token_ids == vanilla.token_ids and eagle.tau > 1.5


def test_with_gradients_on_the_stock_form_runs() -> None:
    """Training never goes through a form that has no backward."""
    linear = nn.Linear(16, 64)
    speed_up(linear, force="packed")
    x = torch.randn(3, 16, requires_grad=True)
    linear(x).sum().backward()
    assert x.grad is not None and linear.weight.grad is not None


def test_only_plain_float_linears_without_hooks_are_swapped() -> None:
    assert swappable(nn.Linear(4, 4))

    class Quantized(nn.Linear):  # bitsandbytes' layers subclass nn.Linear
        pass

    assert not swappable(Quantized(4, 4))
    hooked = nn.Linear(4, 4)
    hooked._hf_hook = object()  # accelerate's offload wraps forward itself
    assert not swappable(hooked)
    assert speed_up(hooked, force="packed") == {False: "stock", True: "stock"}
    assert form_of(hooked, True) == "stock"
    target, _ = easy_llama_pair()
    assert describe(speed_up_readout(target, force="stock")) == "stock"
    assert form_of(target.get_output_embeddings(), many=True) == "stock"


def test_the_loader_reports_the_forms_of_both_projections() -> None:
    from backend.services.loading import load_pair

    pair = load_pair(
        LoadConfig(target="assets/demo/target", head="assets/demo/head-eagle3", readout="packed")
    )
    assert pair.readout_forms == "1 row: packed, more: packed; head: 1 row: packed, more: packed"
    assert form_of(pair.head.lm_head, many=True) == "packed"


def test_timed_forms_are_real_forms_and_keep_the_product() -> None:
    torch.manual_seed(1)
    linear = nn.Linear(64, 2000)
    chosen = choose_forms(linear)
    assert set(chosen) == {False, True} and set(chosen.values()) <= set(FORMS)
    applied = speed_up(linear, known=chosen)
    assert applied == chosen and form_of(linear, many=True) == chosen[True]
    with torch.inference_mode():
        for rows in (1, 6):
            x = torch.randn(rows, 64)
            torch.testing.assert_close(linear(x), F.linear(x, linear.weight, linear.bias))
