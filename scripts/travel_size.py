"""What travels to a lent GPU machine, against the 64 MiB the device tool copies: the working
tree as git sees it (tracked files plus untracked ones git does not ignore) and the wheels
carried in ``.whl/``.

    python3 scripts/travel_size.py          # prints the sizes; exit 1 when over the budget

Standard library only: ``scripts/gpu-wheels.sh`` runs it with any Python, and
``tests/test_travel_size.py`` imports it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUDGET_BYTES = 64 * 1024 * 1024
WHEEL_FOLDER = ".whl"
MIB = 1024 * 1024


def tree_bytes(root: Path = ROOT) -> int:
    """Bytes of the files git would hand over: tracked, or untracked and not ignored."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        check=True,
        capture_output=True,
    ).stdout.decode()
    paths = {root / name for name in listed.split("\0") if name}
    return sum(path.stat().st_size for path in paths if path.is_file())


def wheel_bytes(root: Path = ROOT) -> int:
    return sum(path.stat().st_size for path in (root / WHEEL_FOLDER).glob("*.whl"))


def report(root: Path = ROOT) -> tuple[str, bool]:
    """One line of sizes in MiB, and whether they fit the budget."""
    tree, wheels = tree_bytes(root), wheel_bytes(root)
    total = tree + wheels
    line = (
        f"tree {tree / MIB:.1f} MiB + wheels {wheels / MIB:.1f} MiB = {total / MIB:.1f} MiB "
        f"of {BUDGET_BYTES / MIB:.0f} MiB"
    )
    return line, total <= BUDGET_BYTES


if __name__ == "__main__":
    text, fits = report()
    print(text + ("" if fits else ": OVER the budget"))
    sys.exit(0 if fits else 1)
