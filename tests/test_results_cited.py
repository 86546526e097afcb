"""bench-results/ holds only the runs behind the current tables: every folder in it is named, in
full, by README.md or a page of docs/, and every folder those name exists. A name with capitals
(``NAME``, ``gpu-h100-YYYYMMDD``) is a placeholder, not a folder."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench-results"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CITED = re.compile(r"bench-results/([A-Za-z0-9_.-]*[A-Za-z0-9_-])")


def cited() -> dict[str, str]:
    """Folder name -> the first doc line naming it."""
    names: dict[str, str] = {}
    for doc in DOCS:
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for name in CITED.findall(line):
                if name == name.lower():
                    names.setdefault(name, f"{doc.relative_to(ROOT)}:{number}")
    return names


def test_every_folder_a_doc_names_exists() -> None:
    missing = {name: where for name, where in cited().items() if not (RESULTS / name).is_dir()}
    assert not missing, f"docs name results folders that do not exist: {missing}"


def test_every_results_folder_is_named_by_a_doc() -> None:
    folders = (
        {path.name for path in RESULTS.iterdir() if path.is_dir()} if RESULTS.is_dir() else set()
    )
    unnamed = sorted(folders - set(cited()))
    assert not unnamed, f"results folders no doc names (delete them or cite them): {unnamed}"


def test_the_check_sees_a_cited_name_and_skips_placeholders() -> None:
    line = "see bench-results/gemma-trees, bench-results/gpu-h100-YYYYMMDD and bench-results/NAME."
    assert [n for n in CITED.findall(line) if n == n.lower()] == ["gemma-trees"]
