"""Size rules that keep the code readable, checked by parsing every source file: no file over
600 lines, no function over 60 lines (Gradio layout builders excepted), no function with more
than 6 parameters (Gradio handlers excepted: Gradio passes each input as one argument), and no
comment or docstring that points outside the repository."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "backend", "models")
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 60
MAX_PARAMETERS = 6
# Gradio layout builders: one statement per component, long by nature.
LAYOUT_BUILDERS = {
    ("app/chat_tab.py", "build_chat_tab"),
    ("app/models_tab.py", "build_models_tab"),
    ("app/race_tab.py", "build_race_tab"),
}
# Gradio handlers: their parameters are the event's input components, in order.
GRADIO_HANDLERS = {
    ("app/chat_tab.py", "chat"),
    ("app/chat_tab.py", "regenerate"),
    ("app/race_tab.py", "race"),
}


def sources() -> list[Path]:
    files = [ROOT / "launch.py"]
    for package in PACKAGES:
        files += sorted((ROOT / package).rglob("*.py"))
    return files


def functions(path: Path) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef)
    return [node for node in ast.walk(tree) if isinstance(node, kinds)]


def parameter_count(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = node.args
    names = [a.arg for a in args.posonlyargs + args.args] + [a.arg for a in args.kwonlyargs]
    return len([n for n in names if n not in ("self", "cls")])


def test_no_source_file_is_over_600_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in sources()
        if (n := p.read_text(encoding="utf-8").count("\n")) > MAX_FILE_LINES
    }
    assert not long, long


def test_no_function_is_over_60_lines_or_6_parameters() -> None:
    too_long, too_many = [], []
    for path in sources():
        name = str(path.relative_to(ROOT))
        for node in functions(path):
            key = (name, node.name)
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES and key not in LAYOUT_BUILDERS:
                too_long.append((name, node.name, lines))
            if parameter_count(node) > MAX_PARAMETERS and key not in GRADIO_HANDLERS:
                too_many.append((name, node.name, parameter_count(node)))
    assert not too_long, too_long
    assert not too_many, too_many


def test_the_exceptions_still_exist() -> None:
    """An exception that no longer matches a function would silently widen the rule."""
    present = {(str(p.relative_to(ROOT)), node.name) for p in sources() for node in functions(p)}
    assert LAYOUT_BUILDERS | GRADIO_HANDLERS <= present


def test_no_comment_points_outside_the_repository() -> None:
    cited = [
        str(p.relative_to(ROOT))
        for p in sources() + sorted((ROOT / "tests").rglob("*.py"))
        if p != Path(__file__).resolve()
        and any(mark in p.read_text(encoding="utf-8") for mark in ("eagle.md", "shared/docs"))
    ]
    assert not cited, cited
