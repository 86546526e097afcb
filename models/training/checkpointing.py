"""Training checkpoints: ``out_dir/checkpoint-<step>/`` holds the head in the official format
(config.json + model.safetensors) and ``trainer_state.pt`` (optimizer, scheduler, step, RNGs,
history), read back with ``weights_only=True``. A checkpoint folder exists only once complete.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import torch

from models.checkpoints import load_head, save_head
from models.errors import ConfigError
from models.heads.base import DraftHead
from models.training.fc_scaling import load_plain_state, plain_head

logger = logging.getLogger(__name__)

STATE_NAME = "trainer_state.pt"
CHECKPOINT_PREFIX = "checkpoint-"


def checkpoint_dirs(out_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints in ``out_dir``, oldest first."""
    found = []
    for path in Path(out_dir).glob(f"{CHECKPOINT_PREFIX}*"):
        suffix = path.name[len(CHECKPOINT_PREFIX) :]
        if suffix.isdigit() and (path / STATE_NAME).is_file():
            found.append((int(suffix), path))
    return sorted(found)


def save_checkpoint(out_dir: Path, step: int, head: DraftHead, state: dict, keep: int) -> Path:
    final = out_dir / f"{CHECKPOINT_PREFIX}{step}"
    partial = out_dir / f".{CHECKPOINT_PREFIX}{step}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    save_head(plain_head(head), partial)
    torch.save(state, partial / STATE_NAME)
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)  # a checkpoint dir exists only once complete
    for _, old in checkpoint_dirs(out_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    logger.info("saved checkpoint %s", final)
    return final


def restore_checkpoint(path: Path, head: DraftHead) -> dict:
    loaded = load_head(path)
    if loaded.config.to_dict() != head.config.to_dict():
        raise ConfigError(
            f"checkpoint {path} holds a different head than this run would train",
            hint="resume with the same kind, draft vocabulary size and target",
        )
    load_plain_state(head, loaded.state_dict())
    return torch.load(path / STATE_NAME, map_location="cpu", weights_only=True)
