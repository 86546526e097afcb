"""Read and write draft-head checkpoints: ``config.json`` + ``model.safetensors`` (preferred) or
``pytorch_model.bin`` (loaded with ``weights_only=True``).

Loading is strict, unlike the reference implementation (which loads with strict=False and
silently keeps random weights): every missing, unexpected or mis-shaped key is reported by name
in one CheckpointError. Other layouts (SpecForge) are mapped onto the official key names by a
rename table per format before the check.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from models.errors import CheckpointError
from models.heads.base import DraftHead
from models.heads.config import HeadConfig, HeadKind, detect_kind
from models.heads.registry import head_class

logger = logging.getLogger(__name__)

SAFETENSORS_NAME = "model.safetensors"
PICKLE_NAME = "pytorch_model.bin"

# Key prefixes that other layouts put in front of the official names.
_STRIP_PREFIXES = ("model.", "draft_model.")
# Keys some exporters add that carry nothing the head needs.
_IGNORED_KEYS = ("rotary_emb.inv_freq", "layers.0.self_attn.rotary_emb.inv_freq")
_MAX_HEADER_BYTES = 100_000_000  # the format's own bound on the JSON header
DAMAGED_HINT = (
    "the file is incomplete or damaged (an interrupted download?): delete it and download "
    "again (python launch.py download NAME, or Download in the Models tab)"
)


@dataclass(frozen=True, slots=True)
class RawCheckpoint:
    config: dict[str, Any]
    state_dict: dict[str, torch.Tensor]
    weights_file: Path


def read_raw(directory: str | Path) -> RawCheckpoint:
    """Read config.json and the weights file of a head directory, without interpreting them."""
    directory = Path(directory)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"no config.json in head directory {directory}")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{config_path} is not valid JSON: {err}") from err
    if (directory / SAFETENSORS_NAME).is_file():
        weights_file = directory / SAFETENSORS_NAME
        check_safetensors(weights_file)
        try:
            state_dict = load_file(str(weights_file))
        except Exception as err:  # safetensors raises its own error type for bad files
            raise CheckpointError(f"cannot read {weights_file}: {err}", hint=DAMAGED_HINT) from err
    elif (directory / PICKLE_NAME).is_file():
        weights_file = directory / PICKLE_NAME
        try:
            state_dict = torch.load(weights_file, map_location="cpu", weights_only=True)
        except Exception as err:  # pickle errors come in many types; report them as one
            raise CheckpointError(f"cannot read {weights_file}: {err}", hint=DAMAGED_HINT) from err
    else:
        raise CheckpointError(
            f"no {SAFETENSORS_NAME} or {PICKLE_NAME} in head directory {directory}"
        )
    return RawCheckpoint(
        config=config, state_dict=normalise_keys(state_dict), weights_file=weights_file
    )


def check_safetensors(path: str | Path) -> dict[str, Any]:
    """Read a safetensors file's header (returned) and check the file holds every byte it
    promises, so a truncated or garbage file is one clear error naming it, before any library
    reads it."""
    path = Path(path)
    size = path.stat().st_size
    try:
        with path.open("rb") as handle:
            length = int.from_bytes(handle.read(8), "little")
            if size < 8 or not 0 < length <= min(size - 8, _MAX_HEADER_BYTES):
                raise ValueError("no valid header")
            header = json.loads(handle.read(length))
        entries = [v for k, v in header.items() if k != "__metadata__"]
        data_end = max((int(entry["data_offsets"][1]) for entry in entries), default=0)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as err:
        raise CheckpointError(
            f"{path} is not a valid safetensors file ({err})", hint=DAMAGED_HINT
        ) from err
    if 8 + length + data_end > size:
        raise CheckpointError(
            f"{path} is truncated: {size} bytes on disk, its header describes "
            f"{8 + length + data_end}",
            hint=DAMAGED_HINT,
        )
    return header


def check_safetensors_folder(directory: str | Path) -> None:
    """``check_safetensors`` for every weights file of a model folder (shards included)."""
    for path in sorted(Path(directory).glob("*.safetensors")):
        check_safetensors(path)


def normalise_keys(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Map other layouts' key names onto the official ones (prefixes, ignorable buffers)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        for prefix in _STRIP_PREFIXES:
            if key.startswith(prefix):
                key = key[len(prefix) :]
                break
        if key in _IGNORED_KEYS:
            continue
        out[key] = value
    return out


def build_head(raw: RawCheckpoint) -> DraftHead:
    """Instantiate the right head for a raw checkpoint and load its weights strictly."""
    kind = detect_kind(raw.config, raw.state_dict.keys())
    config = HeadConfig.from_dict(raw.config, kind)
    state_dict = dict(raw.state_dict)
    if kind is HeadKind.EAGLE3 and not config.has_reduced_vocab:
        # Equal vocabularies: the mapping is the identity, whether or not it was saved.
        state_dict.pop("d2t", None)
        state_dict.pop("t2d", None)
    if kind is HeadKind.EAGLE3 and config.has_reduced_vocab and "d2t" not in state_dict:
        raise CheckpointError(
            f"{raw.weights_file}: draft_vocab_size {config.draft_vocab_size} is smaller than "
            f"vocab_size {config.vocab_size} but the checkpoint has no d2t mapping, so draft "
            "tokens cannot be translated to target tokens",
            hint="re-export the head with its d2t/t2d buffers",
        )
    with_embedding = "embed_tokens.weight" in state_dict
    head = head_class(kind)(config, with_embedding=with_embedding)
    _check_keys(head, state_dict, raw.weights_file)
    head.load_state_dict(state_dict, strict=True)
    if kind is HeadKind.EAGLE3 and config.has_reduced_vocab:
        _check_vocab_mapping(head, raw.weights_file)
    return head.eval()


def load_head(directory: str | Path) -> DraftHead:
    raw = read_raw(directory)
    head = build_head(raw)
    logger.info("loaded %s head from %s (%s)", head.kind.value, directory, raw.weights_file.name)
    return head


def save_head(
    head: DraftHead,
    directory: str | Path,
    include_embedding: bool = False,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write the official format: config.json + model.safetensors (no borrowed target weights).

    ``include_embedding`` saves the embedding the head uses (its own or the borrowed target's),
    for loaders that cannot reach the target's. ``dtype`` casts floating-point weights (e.g.
    bfloat16 to halve the file); the ``d2t``/``t2d`` buffers keep theirs. config.json says
    whether the embedding is in the file (see ``HeadConfig.to_dict``).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu").contiguous() for k, v in head.state_dict().items()}
    if include_embedding and "embed_tokens.weight" not in state:
        state["embed_tokens.weight"] = head.embedding.weight.detach().to("cpu").contiguous()
    if not include_embedding:
        state.pop("embed_tokens.weight", None)
    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    float_dtypes = {v.dtype for v in state.values() if v.is_floating_point()}
    dtype_name = str(float_dtypes.pop()).removeprefix("torch.") if len(float_dtypes) == 1 else None
    head.config.save(directory, saved_embedding="embed_tokens.weight" in state, dtype=dtype_name)
    save_file(state, str(directory / SAFETENSORS_NAME))
    return directory


def _check_keys(head: DraftHead, state_dict: dict[str, torch.Tensor], source: Path) -> None:
    expected = {k: v.shape for k, v in head.state_dict().items()}
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    misshaped = sorted(
        f"{k}: checkpoint {tuple(state_dict[k].shape)} vs config {tuple(expected[k])}"
        for k in set(expected) & set(state_dict)
        if tuple(state_dict[k].shape) != tuple(expected[k])
    )
    if not (missing or unexpected or misshaped):
        return
    problems = []
    if missing:
        problems.append("missing keys: " + ", ".join(missing))
    if unexpected:
        problems.append("unexpected keys: " + ", ".join(unexpected))
    if misshaped:
        problems.append("wrong shapes: " + "; ".join(misshaped))
    raise CheckpointError(
        f"{source} does not match its config.json ({head.kind.value} head): "
        + " | ".join(problems),
        hint="the weights and config.json come from different heads, or the file is damaged",
    )


def _check_vocab_mapping(head: DraftHead, source: Path) -> None:
    """Every draft id must name its own target id inside the target vocabulary: two draft ids on
    one target id would split that token's probability between them and misstate q(x)."""
    config = head.config
    target_ids = head.to_target_ids(torch.arange(config.draft_vocab_size))
    hint = "the d2t buffer is damaged or belongs to another head; download or export it again"
    outside = (target_ids < 0) | (target_ids >= config.vocab_size)
    if outside.any():
        draft_id = int(outside.nonzero()[0])
        raise CheckpointError(
            f"{source}: d2t maps draft id {draft_id} to {int(target_ids[draft_id])}, outside the "
            f"target vocabulary (0..{config.vocab_size - 1})",
            hint=hint,
        )
    unique, counts = torch.unique(target_ids, return_counts=True)
    if len(unique) < config.draft_vocab_size:
        shared = int(unique[counts > 1][0])
        draft_ids = (target_ids == shared).nonzero().flatten().tolist()[:4]
        raise CheckpointError(
            f"{source}: d2t maps draft ids {draft_ids} to the same target id {shared}; "
            f"{config.draft_vocab_size - len(unique)} draft ids share a target id",
            hint=hint,
        )
