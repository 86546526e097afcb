"""GGUF targets converted once, read fast after that.

transformers reads a GGUF file's whole metadata again for the config, for the tokenizer and for
the weights (a large vocabulary makes that millions of small reads), and dequantizes every
tensor, on every load. The first float32 load therefore keeps what it built (dequantized
weights as safetensors, config, generation config, tokenizer) in a folder under
``$EAGLECHAT_CACHE_DIR/gguf`` (default ``~/.cache/eaglechat``); later loads of the same file,
in any dtype or quantization, read that folder as a plain transformers model.

The folder is keyed by the file's resolved path, size and modification time and the transformers
version, so an edited or replaced file is converted again. Only float32, unquantized loads are
kept: they hold the dequantized values exactly, and casting them later gives what loading the
GGUF file in that dtype gives. Failing to keep one (a full disk, no permission) is a warning;
the load itself has already succeeded.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from backend.services.cache_home import cache_home, key_digest
from backend.services.target_source import TargetSource

logger = logging.getLogger(__name__)

CONVERSION_FORMAT = 1  # bump when what a kept folder holds changes
_DONE = "eaglechat-conversion.json"  # written last: a folder without it is incomplete
_SPARE_BYTES = 1 << 30  # leave this much of the disk free after keeping a conversion


def cache_dir() -> Path:
    return cache_home() / "gguf"


def conversion_key(gguf_path: str) -> dict:
    """What a conversion depends on: the file itself and the code that read it."""
    import transformers

    path = Path(gguf_path).resolve()
    stat = path.stat()
    return {
        "format": CONVERSION_FORMAT,
        "file": str(path),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "transformers": transformers.__version__,
    }


def _folder(key: dict) -> Path:
    return cache_dir() / f"{Path(key['file']).stem}-{key_digest(key)}"


def converted_source(source: TargetSource) -> TargetSource | None:
    """The kept conversion of a GGUF ``source`` as a plain folder source, or None when there is
    none (or ``source`` is not a GGUF file)."""
    if not source.is_gguf:
        return None
    try:
        key = conversion_key(source.display)
        folder = _folder(key)
        recorded = json.loads((folder / _DONE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if recorded != key:
        return None
    return TargetSource(str(folder), None)


def worth_keeping(model: Any) -> bool:
    """Float32, not quantized again (bitsandbytes), every weight in memory: the exact
    dequantized values."""
    if _quant_method(model.config) not in (None, "gguf"):
        return False
    return all(p.dtype == torch.float32 and p.device.type != "meta" for p in model.parameters())


def _quant_method(config: Any) -> str | None:
    """transformers marks a model loaded from GGUF as quantized with method "gguf" although its
    weights are plain dequantized tensors by then."""
    quant = getattr(config, "quantization_config", None)
    if quant is None:
        return None
    method = quant.get("quant_method") if isinstance(quant, dict) else quant.quant_method
    return str(getattr(method, "value", method))


def _plain_config(config: Any) -> Any:
    """The config without the GGUF marker, so the folder loads (and quantizes) like any other."""
    plain = copy.deepcopy(config)
    if hasattr(plain, "quantization_config"):
        del plain.quantization_config
    return plain


def _weight_bytes(model: Any) -> int:
    storages = {
        p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()
    }
    return sum(storages.values())


def keep_conversion(source: TargetSource, model: Any, tokenizer: Any) -> Path | None:
    """Write the loaded GGUF model as a folder :func:`converted_source` finds next time. Returns
    the folder, or None (with a warning) when it could not be kept."""
    if not source.is_gguf or not worth_keeping(model):
        return None
    from safetensors.torch import save_model

    folder = staging = None
    try:
        key = conversion_key(source.display)  # the file may be gone by now: then keep nothing
        folder = _folder(key)
        staging = folder.with_name(f"{folder.name}.partial-{os.getpid()}")
        cache_dir().mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(cache_dir()).free
        needed = _weight_bytes(model)
        if free - needed < _SPARE_BYTES:
            logger.warning(
                "not keeping the converted GGUF weights (%.1f GB) in %s: only %.1f GB free; "
                "the next load converts the file again",
                needed / 1e9,
                cache_dir(),
                free / 1e9,
            )
            return None
        shutil.rmtree(folder, ignore_errors=True)  # an incomplete earlier attempt
        staging.mkdir(parents=True)
        # save_pretrained refuses models loaded from GGUF; the weights are plain tensors by now
        save_model(model, str(staging / "model.safetensors"), metadata={"format": "pt"})
        _plain_config(model.config).save_pretrained(staging)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / _DONE).write_text(json.dumps(key, sort_keys=True), encoding="utf-8")
        staging.rename(folder)
    except (OSError, RuntimeError, ValueError) as err:  # keeping is optional: the load stands
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        logger.warning(
            "could not keep the converted GGUF weights in %s (%s); the next load converts the "
            "file again",
            folder or cache_dir(),
            err,
        )
        return None
    logger.info("kept the converted GGUF target in %s", folder)
    return folder
