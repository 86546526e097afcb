"""The dependency rules that keep the layers apart, checked by parsing every import statement
(module level, inside functions and under TYPE_CHECKING alike):

- no import cycles among the repository's modules;
- models/ imports nothing from backend/ or app/;
- backend/ never imports gradio or app/;
- backend/engine imports no service, front end, bench or the facade;
- backend/services never imports the facade (backend.api) or a front end;
- app/ imports only the backend's public modules (api, events, config, errors);
- serving code (backend/, app/) never imports models.training, except the front ends that
  train (train-head, make-demo)."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "backend", "models")
APP_ALLOWED = {"backend.api", "backend.events", "backend.config", "backend.errors"}
ENGINE_FORBIDDEN = ("backend.services", "backend.api", "backend.frontends", "backend.bench")
SERVICES_FORBIDDEN = ("backend.api", "backend.frontends")
TRAINING_FRONT_ENDS = {"train_cli", "demo_cli"}  # module names: the commands that train


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def repository_modules() -> dict[str, Path]:
    found = {module_name(ROOT / "launch.py"): ROOT / "launch.py"}
    for package in PACKAGES:
        found |= {module_name(path): path for path in (ROOT / package).rglob("*.py")}
    return found


def imported_names(path: Path, module: str) -> list[str]:
    """Every module an import statement in ``path`` names: ``from a import b`` names ``a`` and
    ``a.b`` (b may be a submodule); relative imports are resolved against ``module``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names.append(base)
            names += [f"{base}.{alias.name}" for alias in node.names]
    return names


def import_graph() -> dict[str, set[str]]:
    """Module -> the repository modules it imports."""
    modules = repository_modules()
    return {
        name: {n for n in imported_names(path, name) if n in modules and n != name}
        for name, path in modules.items()
    }


def imports_under(prefix: str) -> list[tuple[str, str]]:
    """(importing module, imported name) for every module in ``prefix`` (a package)."""
    found = []
    for name, path in repository_modules().items():
        if name == prefix or name.startswith(prefix + "."):
            found += [(name, imported) for imported in imported_names(path, name)]
    return found


def within(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_no_import_cycles() -> None:
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_cycles_through_function_level_imports(tmp_path: Path) -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from backend.api import Backend\n"
        "def f():\n    from . import loop\n    from ..services import hub\n"
    )
    names = imported_names(source, "backend.engine.m")
    assert {"backend.api", "backend.engine.loop", "backend.services.hub"} <= set(names)


def test_models_import_nothing_of_backend_or_app() -> None:
    bad = [(m, n) for m, n in imports_under("models") if within(n, ("backend", "app"))]
    assert not bad, bad


def test_backend_knows_nothing_of_the_ui() -> None:
    bad = [(m, n) for m, n in imports_under("backend") if within(n, ("gradio", "app"))]
    assert not bad, bad


def test_the_engine_imports_no_service_front_end_bench_or_facade() -> None:
    bad = [(m, n) for m, n in imports_under("backend.engine") if within(n, ENGINE_FORBIDDEN)]
    assert not bad, bad


def test_services_never_import_the_facade_or_a_front_end() -> None:
    bad = [(m, n) for m, n in imports_under("backend.services") if within(n, SERVICES_FORBIDDEN)]
    assert not bad, bad


def test_app_uses_only_the_public_backend_api() -> None:
    bad = [
        (m, n)
        for m, n in imports_under("app")
        if (within(n, ("backend",)) and n != "backend" and not within(n, APP_ALLOWED))
        or within(n, ("models", "torch", "transformers"))
    ]
    assert not bad, bad


def test_serving_never_imports_training_code() -> None:
    serving = imports_under("backend") + imports_under("app")
    bad = [
        (m, n)
        for m, n in serving
        if within(n, ("models.training",)) and m.rpartition(".")[2] not in TRAINING_FRONT_ENDS
    ]
    assert not bad, bad
