"""The one dtype resolver: float32 on CPUs without half-precision matrix units (whatever the
catalog prefers), the catalog's dtype or bfloat16 on CUDA, explicit choices honoured; and every
entry point (CLI, app, loading) goes through it."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import torch

from app.models_tab import ModelsController
from backend.api import Backend
from backend.errors import ConfigError
from backend.frontends import generate_cli
from backend.services import dtypes
from backend.services.catalog import load_catalog
from backend.services.dtypes import choose_dtype, resolve_dtype

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cpu_caps(monkeypatch: pytest.MonkeyPatch):
    """Pretend the CPU has exactly the given capabilities."""

    def set_caps(**caps: bool) -> None:
        monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)

    return set_caps


def test_cpu_without_matrix_units_gets_float32_whatever_the_catalog_prefers(cpu_caps) -> None:
    cpu_caps(avx512_f=True, avx512_bf16=True)  # bf16 dot products, but no AMX
    for preferred in ("auto", "float32", "bfloat16", "float16"):
        assert choose_dtype("auto", CPU, preferred) == "float32"
    assert resolve_dtype("auto", CPU, "bfloat16") is torch.float32


def test_cpu_with_amx_honours_a_half_precision_preference(cpu_caps) -> None:
    cpu_caps(amx_bf16=True, amx_tile=True)
    assert choose_dtype("auto", CPU, "bfloat16") == "bfloat16"
    assert choose_dtype("auto", CPU, "float16") == "float32"  # no amx_fp16
    assert choose_dtype("auto", CPU) == "float32"  # no preference: the exact default


def test_cuda_takes_the_catalog_dtype_else_bfloat16(monkeypatch: pytest.MonkeyPatch) -> None:
    assert choose_dtype("auto", CUDA, "float16") == "float16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert choose_dtype("auto", CUDA) == "bfloat16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert choose_dtype("auto", CUDA) == "float16"


def test_explicit_dtype_is_honoured_and_a_bad_one_is_named(cpu_caps) -> None:
    cpu_caps()
    assert choose_dtype("bfloat16", CPU) == "bfloat16"
    assert choose_dtype("float32", CUDA, "bfloat16") == "float32"
    with pytest.raises(ConfigError, match="'fp8'"):
        choose_dtype("fp8", CPU)


def test_catalog_pairs_load_in_float32_on_a_plain_cpu(
    cpu_caps, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu_caps(avx2=True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    half = [pair for pair in load_catalog() if pair.dtype in ("bfloat16", "float16")]
    assert half, "the catalog should have pairs that prefer a half type on GPUs"
    parser = argparse.ArgumentParser()
    generate_cli.add_arguments(parser)
    controller = ModelsController(Backend())
    for pair in half:
        args = parser.parse_args(["--pair", pair.name, "--prompt", "hi"])
        assert generate_cli.load_config_from(args).dtype == "float32", pair.name
        target, head, dtype, *_ = controller.select_pair(pair.name)
        assert (target, dtype) == (pair.target, "float32"), pair.name
        # An explicit choice still wins.
        args = parser.parse_args(["--pair", pair.name, "--prompt", "hi", "--dtype", "bfloat16"])
        assert generate_cli.load_config_from(args).dtype == "bfloat16"


def test_no_other_module_picks_a_default_dtype() -> None:
    """Device-based dtype defaults live in dtypes.py only (they used to be in five places)."""
    pattern = re.compile(r"(torch\.)?[\"']?b?float16[\"']?\s+if\s+.*(cuda|device)")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in ("app", "backend")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path != Path(dtypes.__file__)
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, f"dtype chosen outside backend/services/dtypes.py: {found}"
