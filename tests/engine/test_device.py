"""The one device chooser: an explicit device is honoured, auto means the first GPU or the CPU,
and a device name torch does not know is a clear configuration error."""

from __future__ import annotations

import pytest
import torch

from backend.engine.device import choose_device, cpu_threads
from backend.errors import ConfigError


@pytest.mark.parametrize("requested", [None, "", "auto"])
def test_auto_is_the_first_gpu_when_there_is_one(monkeypatch, requested) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert choose_device(requested) == torch.device("cuda:0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert choose_device(requested) == torch.device("cpu")


def test_an_explicit_device_is_honoured(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert choose_device("cpu") == torch.device("cpu")
    assert choose_device("cuda:1") == torch.device("cuda", 1)


def test_an_unknown_device_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="unknown device 'gpu0'") as caught:
        choose_device("gpu0")
    assert "cuda:1" in caught.value.hint


def test_cpu_threads_sets_the_count_for_the_block_and_restores_it(four_threads) -> None:
    with cpu_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 4
    with pytest.raises(RuntimeError), cpu_threads(2):
        assert torch.get_num_threads() == 2
        raise RuntimeError("a failing round")
    assert torch.get_num_threads() == 4


@pytest.mark.parametrize("count", [None, 0, 4])
def test_cpu_threads_without_a_new_count_leaves_it_alone(four_threads, count) -> None:
    with cpu_threads(count):
        assert torch.get_num_threads() == 4
    assert torch.get_num_threads() == 4
