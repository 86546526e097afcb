"""The rows-first output projection: same numbers as F.linear, same greedy text, applied only to
plain float Linear layers it may own."""

from __future__ import annotations

import torch
from torch import nn

from backend.config import TreeConfig
from backend.engine.readout import rows_first_forward, speed_up_readout, swappable, uses_rows_first
from tests.engine.helpers import make_runner, run
from tests.factories import easy_llama_pair


def test_rows_first_equals_f_linear_for_every_row_count_and_shape() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(48, 300, bias=True)
    for shape in [(1, 48), (2, 48), (7, 48), (1, 5, 48), (2, 3, 48)]:
        x = torch.randn(*shape)
        ours = rows_first_forward(linear, x)
        assert ours.shape == linear(x).shape
        torch.testing.assert_close(ours, linear(x), rtol=1e-5, atol=1e-5)


def test_forced_swap_keeps_greedy_eagle_identical_to_vanilla() -> None:
    target, head = easy_llama_pair()
    assert speed_up_readout(target, force=True) and uses_rows_first(target)
    runner, drafter = make_runner(target, head)
    prompt = [3, 1, 4, 1, 5]
    tree = TreeConfig(total_tokens=12, depth=5, top_k=3)
    eagle, _ = run(runner, drafter, prompt, mode="eagle", max_new_tokens=60, tree=tree)
    vanilla, _ = run(runner, drafter, prompt, mode="vanilla", max_new_tokens=60)
    assert eagle.token_ids == vanilla.token_ids and eagle.tau > 1.5


def test_only_plain_float_linears_without_hooks_are_swapped() -> None:
    assert swappable(nn.Linear(4, 4))

    class Quantized(nn.Linear):  # bitsandbytes' layers subclass nn.Linear
        pass

    assert not swappable(Quantized(4, 4))
    hooked = nn.Linear(4, 4)
    hooked._hf_hook = object()  # accelerate's offload wraps forward itself
    assert not swappable(hooked)
    target, _ = easy_llama_pair()
    assert not speed_up_readout(target, force=False) and not uses_rows_first(target)
