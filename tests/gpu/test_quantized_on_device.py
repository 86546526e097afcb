"""bitsandbytes 8-bit and 4-bit targets on the device: the CPU test's checks (quantized decoder,
unquantized lm_head and head, greedy EAGLE == vanilla) where the quantized kernels are CUDA's.
The GPU machine has no bitsandbytes: it runs only when scripts/gpu-wheels.sh could carry the
wheel within the 64 MiB that travels, and skips with that reason otherwise."""

from __future__ import annotations

import importlib.util

import pytest

from backend.config import LoadConfig
from tests.gpu.device import ON_DEVICE
from tests.services.conftest import SavedPairs
from tests.services.test_loading_bnb import assert_quantized_eagle_equals_vanilla

pytestmark = ON_DEVICE


@pytest.mark.parametrize(
    "quantization, layer_class", [("4bit", "Linear4bit"), ("8bit", "Linear8bitLt")]
)
def test_quantized_target(
    saved_pairs: SavedPairs, quantization: str, layer_class: str, caplog: pytest.LogCaptureFixture
) -> None:
    if importlib.util.find_spec("bitsandbytes") is None:  # found, not imported: the load does
        pytest.skip(
            "bitsandbytes is not installed: its wheel did not travel (scripts/gpu-wheels.sh "
            "carries it only within the 64 MiB budget)"
        )
    config = LoadConfig(
        str(saved_pairs.target), str(saved_pairs.head), quantization=quantization, dtype="float32"
    )
    assert_quantized_eagle_equals_vanilla(config, layer_class, caplog)
