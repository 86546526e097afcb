"""The dependency rule that keeps the layers apart, checked by parsing imports:
models/ never imports backend/ (except the leaf backend.errors) or app/; backend/ never imports
gradio or app/; app/ imports only the backend's public modules."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APP_ALLOWED = {"backend.api", "backend.events", "backend.config", "backend.errors"}


def imports_of(package: str) -> list[tuple[Path, str]]:
    found = []
    for path in (ROOT / package).rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [(path, alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.append((path, node.module))
    return found


def test_models_do_not_depend_on_serving_code() -> None:
    bad = [
        (p.name, m) for p, m in imports_of("models")
        if m.startswith("app") or (m.startswith("backend") and m != "backend.errors")
    ]  # fmt: skip
    assert not bad, bad


def test_backend_knows_nothing_of_the_ui() -> None:
    bad = [(p.name, m) for p, m in imports_of("backend") if m.split(".")[0] in ("gradio", "app")]
    assert not bad, bad


def test_app_uses_only_the_public_backend_api() -> None:
    bad = [
        (p.name, m) for p, m in imports_of("app")
        if (m.startswith("backend") and m not in APP_ALLOWED)
        or m.split(".")[0] in ("models", "torch", "transformers")
    ]  # fmt: skip
    assert not bad, bad
