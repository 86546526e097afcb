"""The one device chooser: an explicit device is honoured, auto means the first GPU or the CPU,
and a device name torch does not know is a clear configuration error."""

from __future__ import annotations

import pytest
import torch

from backend.engine.device import choose_device
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
