"""Known target/head pairs, read from ``assets/catalog.json``.

The catalog is data, not code: adding a released head means adding one JSON entry. Entries
are validated strictly (unknown keys, bad kinds, bad tree settings raise ConfigError) so a typo
fails at load time with the entry named, not later as a confusing download or load error.

    >>> [p.name for p in load_catalog()][:2]
    ['demo', 'gemma3-270m']
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from backend.config import DType, PromptFormat, TreeConfig
from backend.errors import ConfigError
from backend.services.target_source import PACKAGE_PREFIX

logger = logging.getLogger(__name__)

HeadKind = Literal["eagle1", "eagle3"]

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CATALOG = REPO_ROOT / "assets" / "catalog.json"

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_REQUIRED = {"name", "target", "head", "head_kind", "target_gb", "head_gb", "gated", "tree"}
_OPTIONAL = {"dtype", "note", "offline", "prompt_format"}
_TREE_KEYS = {"total_tokens", "depth", "top_k"}


@dataclass(frozen=True, slots=True)
class PairSpec:
    """One target model and the draft head trained for it."""

    name: str  # short id used by the CLI and the UI, e.g. "llama3.1-8b-eagle3"
    target: str  # Hub repo id, or an absolute local path when offline
    head: str  # Hub repo id, or an absolute local path when offline
    head_kind: HeadKind  # "eagle1" (EAGLE-1/2 checkpoints) or "eagle3"
    target_gb: float  # approximate download size; a dry run gives exact bytes
    head_gb: float
    gated: bool  # the target needs an accepted licence and a token
    tree: TreeConfig  # recommended tree for the device class the pair targets
    dtype: DType = "auto"
    note: str = ""
    offline: bool = False  # bundled with the repo: target/head are local paths
    prompt_format: PromptFormat = "auto"  # the conversation format the head was trained with

    @property
    def total_gb(self) -> float:
        return self.target_gb + self.head_gb


def load_catalog(path: str | Path | None = None) -> list[PairSpec]:
    """Read and validate every pair; ``path`` defaults to the bundled catalog."""
    catalog_path = Path(path) if path is not None else DEFAULT_CATALOG
    try:
        data = json.loads(catalog_path.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise ConfigError(f"catalog not found: {catalog_path}") from err
    except json.JSONDecodeError as err:
        raise ConfigError(
            f"catalog {catalog_path} is not valid JSON: {err}", hint="fix the JSON syntax"
        ) from err
    if not isinstance(data, dict) or not isinstance(data.get("pairs"), list):
        raise ConfigError(f"catalog {catalog_path} must be an object with a 'pairs' list")
    pairs = [_parse_entry(entry, index) for index, entry in enumerate(data["pairs"])]
    names = [pair.name for pair in pairs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ConfigError(f"catalog {catalog_path} has duplicate pair names: {duplicates}")
    logger.debug("loaded %d catalog pairs from %s", len(pairs), catalog_path)
    return pairs


def find_pair(name: str, path: str | Path | None = None) -> PairSpec:
    """The pair called ``name``; a ConfigError lists the known names otherwise."""
    pairs = load_catalog(path)
    for pair in pairs:
        if pair.name == name:
            return pair
    known = ", ".join(pair.name for pair in pairs)
    raise ConfigError(f"unknown pair {name!r}", hint=f"known pairs: {known}")


def _parse_entry(entry: Any, index: int) -> PairSpec:
    """Validate one JSON entry; every message names the entry so it can be found."""
    where = f"catalog entry #{index}"
    if not isinstance(entry, dict):
        raise ConfigError(f"{where} must be an object, got {type(entry).__name__}")
    if isinstance(entry.get("name"), str):
        where = f"catalog entry {entry['name']!r}"
    unknown = sorted(set(entry) - _REQUIRED - _OPTIONAL)
    if unknown:
        allowed = ", ".join(sorted(_REQUIRED | _OPTIONAL))
        raise ConfigError(f"{where} has unknown keys {unknown}", hint=f"allowed keys: {allowed}")
    missing = sorted(_REQUIRED - set(entry))
    if missing:
        raise ConfigError(f"{where} is missing keys {missing}")

    name = _typed(entry, "name", str, where)
    if not name or any(ch.isspace() for ch in name):
        raise ConfigError(f"{where}: name must be a non-empty word, got {name!r}")
    kind = entry["head_kind"]
    if kind not in get_args(HeadKind):
        raise ConfigError(
            f"{where}: head_kind must be one of {list(get_args(HeadKind))}, got {kind!r}"
        )
    dtype = entry.get("dtype", "auto")
    if dtype not in get_args(DType):
        raise ConfigError(f"{where}: dtype must be one of {list(get_args(DType))}, got {dtype!r}")
    offline = _typed(entry, "offline", bool, where, default=False)
    prompt_format = entry.get("prompt_format", "auto")
    if prompt_format not in get_args(PromptFormat):
        raise ConfigError(
            f"{where}: prompt_format must be one of {list(get_args(PromptFormat))}, "
            f"got {prompt_format!r}"
        )
    target = _location(_typed(entry, "target", str, where), offline, where)
    head = _location(_typed(entry, "head", str, where), offline, where)
    sizes = [_typed(entry, key, (int, float), where) for key in ("target_gb", "head_gb")]
    if any(size < 0 for size in sizes):
        raise ConfigError(f"{where}: target_gb and head_gb must be non-negative numbers")
    return PairSpec(
        name=name,
        target=target,
        head=head,
        head_kind=kind,
        target_gb=float(sizes[0]),
        head_gb=float(sizes[1]),
        gated=_typed(entry, "gated", bool, where),
        tree=_parse_tree(entry["tree"], where),
        dtype=dtype,
        note=_typed(entry, "note", str, where, default=""),
        offline=offline,
        prompt_format=prompt_format,
    )


def _parse_tree(tree: Any, where: str) -> TreeConfig:
    if not isinstance(tree, dict):
        raise ConfigError(f"{where}: tree must be an object with {sorted(_TREE_KEYS)}")
    if set(tree) != _TREE_KEYS:
        raise ConfigError(
            f"{where}: tree must have exactly {sorted(_TREE_KEYS)}, got {sorted(tree)}"
        )
    if not all(isinstance(tree[key], int) and not isinstance(tree[key], bool) for key in tree):
        raise ConfigError(f"{where}: tree values must be integers, got {tree}")
    try:
        return TreeConfig(**tree)
    except ConfigError as err:
        raise ConfigError(f"{where}: {err.message}", hint=err.hint) from err


def _location(value: str, offline: bool, where: str) -> str:
    """Offline pairs name repo-relative paths (made absolute here); others name Hub repo ids.
    ``pypi:PACKAGE`` names a model shipped as a registry package (resolved when used)."""
    if value.startswith(PACKAGE_PREFIX):
        return value
    if offline:
        path = Path(value)
        return str(path if path.is_absolute() else (REPO_ROOT / path).resolve())
    if not _REPO_ID.match(value):
        raise ConfigError(
            f"{where}: {value!r} is not a Hub repo id (org/name)",
            hint='set "offline": true for a pair stored in local folders',
        )
    return value


def _typed(
    entry: dict[str, Any],
    key: str,
    kind: type | tuple[type, ...],
    where: str,
    default: Any = None,
) -> Any:
    if key not in entry:
        return default
    value = entry[key]
    # bool is an int subclass: a true/false where a number is expected is a typo.
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _as_tuple(kind)):
        raise ConfigError(f"{where}: {key} has the wrong type ({type(value).__name__})")
    return value


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)
