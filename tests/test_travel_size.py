"""The tree that travels to a lent GPU machine, plus the wheels carried with it, stays within the
64 MiB the device tool copies (docs/gpu.md): over it, scripts/gpu-check.sh cannot run there."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def travel_size():
    spec = importlib.util.spec_from_file_location("travel_size", ROOT / "scripts/travel_size.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout"
)
def test_the_travelling_tree_and_wheels_fit_the_budget() -> None:
    sizes = travel_size()
    tree = sizes.tree_bytes()
    assert tree > 1024 * 1024  # the sum is real: the demo pair alone is megabytes
    line, fits = sizes.report()
    assert fits, f"{line}: prune tracked files or carry fewer wheels (scripts/gpu-wheels.sh)"
