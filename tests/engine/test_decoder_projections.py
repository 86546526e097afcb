"""The target's decoder projections swapped at load (fused siblings, per-shape CPU forms): the
same outputs and parameters as the stock model on every architecture, lossless EAGLE, choices
reused from the cache, and an undo when a probe forward disagrees."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from backend.config import TreeConfig
from backend.engine import decoder_projections as dp
from backend.engine import projection_forms
from backend.engine.projection_forms import form_of
from tests.engine.helpers import make_runner, run
from tests.factories import ARCHITECTURES, easy_llama_pair, tiny_target


@pytest.fixture
def always_fuse(monkeypatch):
    """Fusion kept whatever the timing says (on a tiny model it is a coin toss)."""
    monkeypatch.setattr(dp, "FUSE_GAIN", 0.0)


def fused_tiny(arch: str = "llama", pack: bool = False) -> nn.Module:
    model = tiny_target(arch)
    dp.speed_up_decoder(model, {}, pack=pack)
    return model


def shared(model: nn.Module) -> list[nn.Linear]:
    return [m for m in model.modules() if "shared_product" in m.__dict__]


def logits_with_cache(model: nn.Module, ids: list[list[int]]) -> list[torch.Tensor]:
    """A prompt, then a several-token and a one-token step on the same cache."""
    from transformers import DynamicCache

    cache, out = DynamicCache(config=model.config), []
    with torch.inference_mode():
        for chunk in ids:
            out.append(model(input_ids=torch.tensor([chunk]), cache=cache).logits)
    return out


@pytest.mark.parametrize("arch", [*ARCHITECTURES, "gemma"])
def test_fused_projections_give_the_stock_outputs_on_every_architecture(arch, always_fuse) -> None:
    model = tiny_target(arch)
    steps = [[3, 5, 7, 9, 11], [13, 17, 19], [23]]
    expected = logits_with_cache(model, steps)
    state = {name: value.clone() for name, value in model.state_dict().items()}
    forms = dp.speed_up_decoder(model, {}, pack=True)
    assert any(name.startswith("decoder q_proj+k_proj+v_proj") for name in forms)
    layers = model.config.num_hidden_layers
    mlp_groups = 0 if arch == "mixtral" else layers  # Mixtral's experts are no gate/up linears
    assert len(shared(model)) == 3 * layers + 2 * mlp_groups
    for ours, stock in zip(logits_with_cache(model, steps), expected):
        torch.testing.assert_close(ours, stock, rtol=1e-4, atol=1e-4)
    after = model.state_dict()
    assert after.keys() == state.keys()
    for name, value in state.items():
        assert torch.equal(after[name], value), name


def test_fused_siblings_share_one_storage_and_in_place_updates_reach_it(always_fuse) -> None:
    model = fused_tiny("qwen2")  # q/k/v with biases
    attention = model.model.layers[0].self_attn
    pointers = {
        p.untyped_storage().data_ptr()
        for p in (attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight)
    }
    assert len(pointers) == 1
    x = torch.randn(1, 3, model.config.hidden_size)
    with torch.no_grad():
        attention.k_proj.weight.mul_(2.0)
        attention.k_proj.bias.add_(1.0)
    with torch.inference_mode():
        attention.q_proj(x)  # the first member computes the whole product
        got = attention.k_proj(x)
    expected = torch.nn.functional.linear(x, attention.k_proj.weight, attention.k_proj.bias)
    torch.testing.assert_close(got, expected)


def test_a_member_called_on_another_tensor_computes_its_own(always_fuse) -> None:
    model = fused_tiny()
    mlp = model.model.layers[1].mlp
    a, b = torch.randn(1, 2, 64), torch.randn(1, 2, 64)
    with torch.inference_mode():
        mlp.gate_proj(a)
        up_b = mlp.up_proj(b)  # not the tensor the product was computed for
        up_a = mlp.up_proj(a)
    torch.testing.assert_close(up_b, torch.nn.functional.linear(b, mlp.up_proj.weight))
    torch.testing.assert_close(up_a, torch.nn.functional.linear(a, mlp.up_proj.weight))


def test_threads_do_not_take_each_others_slices(always_fuse) -> None:
    model = fused_tiny()
    attention = model.model.layers[0].self_attn
    mine, theirs = torch.randn(1, 3, 64), torch.randn(1, 3, 64)
    with torch.inference_mode():
        attention.q_proj(mine)

        def other_thread() -> None:
            with torch.inference_mode():
                attention.q_proj(theirs)
                attention.k_proj(theirs)

        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
        k = attention.k_proj(mine)
    torch.testing.assert_close(k, torch.nn.functional.linear(mine, attention.k_proj.weight))


def test_with_gradients_on_each_linear_runs_on_its_own_and_trains(always_fuse) -> None:
    model = fused_tiny(pack=True)
    attention = model.model.layers[0].self_attn
    x = torch.randn(1, 3, 64)
    (attention.q_proj(x).sum() + attention.v_proj(x).sum()).backward()
    assert attention.q_proj.weight.grad is not None and attention.v_proj.weight.grad.abs().sum() > 0


def test_eagle_stays_identical_to_vanilla_with_the_swap(always_fuse) -> None:
    target, head = easy_llama_pair()
    forms = dp.speed_up_decoder(target, {}, pack=True)
    assert forms and shared(target)
    runner, drafter = make_runner(target, head)
    prompt = [3, 1, 4, 1, 5]
    for tree in (
        TreeConfig(total_tokens=12, depth=5, top_k=3),
        TreeConfig(total_tokens=6, depth=5, top_k=1),
    ):
        eagle, _ = run(runner, drafter, prompt, mode="eagle", max_new_tokens=48, tree=tree)
        vanilla, _ = run(runner, drafter, prompt, mode="vanilla", max_new_tokens=48)
        assert eagle.token_ids == vanilla.token_ids and eagle.tau > 1.5


def test_fusion_is_kept_only_where_it_was_timed_faster(monkeypatch) -> None:
    """Separate calls timed faster: the group stays separate, its linears keep their own forms."""
    timings = iter([1.0, 1.0, 2.0, 2.0] * 8)  # separate (one row, several), then fused
    monkeypatch.setattr(dp, "_time_calls", lambda members, rows: next(timings))
    model = tiny_target("llama")
    forms = dp.speed_up_decoder(model, {}, pack=False)
    groups = {name: chosen for name, chosen in forms.items() if "+" in name}
    assert groups and all(chosen == dp.UNFUSED for chosen in groups.values())
    assert not shared(model)
    assert dp.describe_decoder(forms).startswith(("stock", "fused nothing"))


def test_a_group_can_be_fused_for_several_rows_only(monkeypatch) -> None:
    timings = iter([1.0, 2.0, 2.0, 1.0] * 8)  # fused loses on one row, wins on several
    monkeypatch.setattr(dp, "_time_calls", lambda members, rows: next(timings))
    model = tiny_target("llama")
    steps = [[3, 5, 7, 9], [11, 13], [17]]
    expected = logits_with_cache(model, steps)
    forms = dp.speed_up_decoder(model, {}, pack=False)
    groups = [chosen for name, chosen in forms.items() if "+" in name]
    assert groups and all(c[False] == "unfused" != c[True] for c in groups)
    q_proj = model.model.layers[0].self_attn.q_proj
    assert q_proj.shared_product.fused_rows == {False: False, True: True}
    calls = []
    real = dp.SharedProduct.output

    def spy(self, index, x):
        calls.append((x.numel() > x.shape[-1], self.fused_rows[x.numel() > x.shape[-1]]))
        return real(self, index, x)

    monkeypatch.setattr(dp.SharedProduct, "output", spy)
    for ours, stock in zip(logits_with_cache(model, steps), expected):
        torch.testing.assert_close(ours, stock, rtol=1e-4, atol=1e-4)
    assert {(False, False), (True, True)} <= set(calls)
    assert "(several rows)" in dp.describe_decoder(forms)
    again = tiny_target("llama")  # the cached choice, applied without timing
    monkeypatch.setattr(dp, "_time_calls", lambda members, rows: 1 / 0)
    dp.speed_up_decoder(again, dp.known_decoder_forms(forms), pack=False)
    assert again.model.layers[1].mlp.up_proj.shared_product.fused_rows == {False: False, True: True}


def test_known_choices_are_applied_without_timing(monkeypatch, always_fuse) -> None:
    first = tiny_target("llama")
    forms = dp.speed_up_decoder(first, {}, pack=True)
    forced = {
        name: (
            {False: "stock", True: "packed"} if "+" not in name or chosen != dp.UNFUSED else chosen
        )
        for name, chosen in forms.items()
    }

    def no_timing(*args, **kwargs):
        raise AssertionError("timed although the choice was known")

    monkeypatch.setattr(dp, "_time_calls", no_timing)
    monkeypatch.setattr(projection_forms, "time_forms", no_timing)
    second = tiny_target("llama")
    again = dp.speed_up_decoder(second, dp.known_decoder_forms(forced), pack=True)
    assert again == {name: forced[name] for name in again}  # member shapes: only when timed
    assert {name for name in forced if "+" in name} <= set(again)
    down = second.model.layers[0].mlp.down_proj
    assert (form_of(down, many=False), form_of(down, many=True)) == ("stock", "packed")


def test_without_room_to_pack_no_packed_copy_is_made(always_fuse) -> None:
    model = tiny_target("llama")
    dp.speed_up_decoder(model, {"decoder 64x128": {False: "packed", True: "packed"}}, pack=False)
    for module in model.modules():
        assert getattr(module, "packed_weight", None) is None
        for product in (
            [module.shared_product.product] if "shared_product" in module.__dict__ else []
        ):
            assert getattr(product, "packed_weight", None) is None


def test_a_swap_that_changes_the_outputs_is_undone(monkeypatch, always_fuse) -> None:
    model = tiny_target("llama")
    ids = [[3, 5, 7]]
    expected = logits_with_cache(model, ids)
    real = dp.SharedProduct.output
    monkeypatch.setattr(dp.SharedProduct, "output", lambda self, i, x: real(self, i, x) * 1.5)
    assert dp.speed_up_decoder(model, {}, pack=True) == {}
    assert not any("forward" in m.__dict__ for m in model.modules() if isinstance(m, nn.Linear))
    torch.testing.assert_close(logits_with_cache(model, ids)[0], expected[0])
