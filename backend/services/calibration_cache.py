"""Measured device costs kept on disk, so a second launch of the same pair skips calibration
(and reuses the projection forms chosen with them, backend/engine/projection_forms.py).

A cost model is only valid for the weights, device, dtype, quantization and thread count it
was timed with, so all of them (plus the torch version and the cost format) go into the key.
Files are small JSON documents under ``$EAGLECHAT_CACHE_DIR/calibration`` (default
``~/.cache/eaglechat``); a damaged or unreadable entry is ignored and measured again.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from backend.engine.calibration import (
    CALIBRATION_CONTEXT,
    MEASURED_SIZES,
    CostModel,
    RoundThreads,
)
from backend.engine.device import hardware_name
from backend.engine.projection_forms import Forms
from backend.services.cache_home import cache_home, keep, key_digest

logger = logging.getLogger(__name__)

COST_FORMAT = 15  # bump when what calibrate() measures changes (or what it times got faster)
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".json")


def cache_dir() -> Path:
    return cache_home() / "calibration"


def files_fingerprint(path: str | None) -> list[tuple[str, int, int]]:
    """Name, size and modification time of the weight and config files at ``path``."""
    if path is None:
        return []
    location = Path(path)
    files = [location] if location.is_file() else sorted(location.glob("*"))
    return [
        (f.name, f.stat().st_size, f.stat().st_mtime_ns)
        for f in files
        if f.is_file() and f.name.endswith(_WEIGHT_SUFFIXES)
    ]


def calibration_key(
    target_path: str,
    head_path: str | None,
    device: torch.device,
    dtype: str,
    quantization: str,
    requested: dict | None = None,
) -> dict:
    """Everything a measured cost depends on, as a JSON-ready dict. ``requested``: the load
    options the timings ran under, ``{"projections": "auto/auto", "round_threads": 0}`` by
    default (the readout and decoder forms asked for; the rounds' thread count, 0 = auto).
    ``threads`` is the process's own count, the most a round may use."""
    return {
        "format": COST_FORMAT,
        "target": [str(Path(target_path).resolve()), files_fingerprint(target_path)],
        "head": [head_path and str(Path(head_path).resolve()), files_fingerprint(head_path)],
        "device": hardware_name(device),
        "dtype": dtype,
        "quantization": quantization,
        "projections": "auto/auto",
        "round_threads": 0,
        **(requested or {}),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "context": CALIBRATION_CONTEXT,
        "sizes": list(MEASURED_SIZES),
    }


def _entry(key: dict) -> Path:
    return cache_dir() / f"{key_digest(key)}.json"


@dataclass(frozen=True, slots=True)
class Calibration:
    """What one load measured: the tuner's costs, the forms of the projections by name
    ("target", "head" for the readouts, "decoder <shape>" for the decoder layers), the head's
    precision and the rounds' thread count."""

    costs: CostModel
    forms: dict[str, Forms] = field(default_factory=dict)
    # the head's dtype: the target's ("target"), or "bfloat16" (backend/engine/head_precision.py)
    head_precision: str = "target"
    # CPU threads of plain steps and drafted rounds (the costs were timed on the latter)
    round_threads: RoundThreads | None = None

    def to_json(self) -> dict:
        forms = {
            name: {"one": chosen[False], "many": chosen[True]}
            for name, chosen in self.forms.items()
        }
        return {
            "costs": self.costs.to_json(),
            "forms": forms,
            "head_precision": self.head_precision,
            "round_threads": self.round_threads and self.round_threads.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict) -> Calibration:
        forms = {
            str(name): {False: str(chosen["one"]), True: str(chosen["many"])}
            for name, chosen in data.get("forms", {}).items()
        }
        return cls(
            costs=CostModel.from_json(data["costs"]),
            forms=forms,
            head_precision=str(data.get("head_precision", "target")),
            round_threads=RoundThreads.from_json(data.get("round_threads")),
        )


def load(key: dict) -> Calibration | None:
    path = _entry(key)
    try:
        data = json.loads(path.read_text())
        if data.get("key") != json.loads(json.dumps(key)):
            return None
        return Calibration.from_json(data)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:
        logger.warning("ignoring the unreadable calibration file %s: %s", path, err)
        return None


def save(key: dict, calibration: Calibration) -> None:
    """Best effort: a read-only or full disk only means calibrating again next time."""
    text = json.dumps({"key": key, **calibration.to_json()}, indent=1)
    keep(_entry(key), lambda partial: partial.write_text(text), "the calibration")
