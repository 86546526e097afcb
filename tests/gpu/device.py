"""Where the GPU tests run, and how a tiny model is placed there.

The tests in this folder carry the ``gpu`` marker and run on the first CUDA device. Without
one they skip with the reason "no CUDA device", unless ``EAGLECHAT_GPU_TESTS_ON_CPU=1`` asks
for them on the CPU: the rehearsal of ``scripts/gpu-check.sh --cpu-rehearsal``, which proves
that every step imports and runs before a GPU machine is lent.

Pairs loaded through ``load_pair``/``Backend`` land on the same device by themselves (the
loader picks the first GPU, else the CPU).
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.factories import tiny_head

ON_CPU_VARIABLE = "EAGLECHAT_GPU_TESTS_ON_CPU"


def chosen_device() -> torch.device | None:
    if torch.cuda.is_available():
        return torch.device("cuda", 0)
    if os.environ.get(ON_CPU_VARIABLE) == "1":
        return torch.device("cpu")
    return None


DEVICE = chosen_device()
# pytestmark of every module here
ON_DEVICE = [pytest.mark.gpu, pytest.mark.skipif(DEVICE is None, reason="no CUDA device")]
HEAD_KINDS = ("eagle1", "eagle3")


def placed(target, kind: str, draft_vocab_size: int | None = None):
    """``target`` (fp32) moved to DEVICE and a random head of ``kind`` bound to it there."""
    target = target.to(DEVICE)
    head = tiny_head(kind, target, draft_vocab_size=draft_vocab_size).to(DEVICE)
    return target, head
