"""Read a target's input embedding from its safetensors files without loading the model, for
exports that put a copy into the head (loaders that cannot reach the target's own)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from models.checkpoints import check_safetensors
from models.errors import CheckpointError

EMBEDDING_SUFFIX = "embed_tokens.weight"


def read_target_embedding(target_dir: str | Path) -> torch.Tensor:
    """The [V, H] input embedding (float32) of a local target folder."""
    files = sorted(Path(target_dir).glob("*.safetensors"))
    if not files:
        raise CheckpointError(
            f"no *.safetensors weights in {target_dir}",
            hint="the target's input embedding is read from its safetensors files",
        )
    for path in files:
        check_safetensors(path)
        with safe_open(str(path), framework="pt") as handle:
            names = sorted((k for k in handle.keys() if k.endswith(EMBEDDING_SUFFIX)), key=len)
            if names:  # the shortest name is the language model's own embedding
                return handle.get_tensor(names[0]).float()
    raise CheckpointError(f"no tensor named *{EMBEDDING_SUFFIX} in the weights of {target_dir}")
