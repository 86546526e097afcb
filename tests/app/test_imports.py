"""app/ talks to the backend only through its facade and data objects (architecture.md):
backend.api, backend.events, backend.config, backend.errors; never torch, transformers or
engine internals. Checked by parsing every import statement of app/*.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[2] / "app"
ALLOWED_BACKEND = {"backend.api", "backend.events", "backend.config", "backend.errors"}
FORBIDDEN_TOP = {
    "torch",
    "transformers",
    "models",
    "huggingface_hub",
    "accelerate",
    "bitsandbytes",
    "safetensors",
    "tokenizers",
}


def imported_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
            if node.module == "backend":  # "from backend import engine" names a submodule
                names.extend(f"backend.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("path", sorted(APP.glob("*.py")), ids=lambda p: p.name)
def test_app_imports_only_the_backend_facade(path: Path) -> None:
    for name in imported_modules(path):
        top = name.split(".")[0]
        assert top not in FORBIDDEN_TOP, f"{path.name} imports {name}"
        if top == "backend" and name != "backend":
            assert name in ALLOWED_BACKEND, f"{path.name} imports {name}"


def test_the_checker_catches_a_bad_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import torch\nfrom backend.engine.engine import Engine\nfrom backend import api\n"
    )
    assert imported_modules(bad) == ["torch", "backend.engine.engine", "backend", "backend.api"]
