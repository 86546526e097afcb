"""Load a target straight into its int8 form (``--quantize int8``, backend/engine/int8_linear.py),
one tensor at a time: the whole model never exists in float32.

The model is built with its parameters on ``meta`` (buffers such as rotary tables are real).
Then each stored tensor is read (a GGUF tensor dequantized, a safetensors tensor as stored),
and either re-quantized into its linear's int8 form or kept as a float32 parameter, before the
next one is read. GGUF names and layouts are mapped by transformers' own GGUF tables, so the
result equals transformers' GGUF loading followed by the int8 swap.

With calibration text, each linear is smoothed by the input peaks the model shows reading it
(int8_linear.py). Measuring them needs a model, so the first load of some files places every
tensor, reads the text, and then reads the linears' tensors a second time to quantize them
smoothed; the peaks are kept in the cache (``$EAGLECHAT_CACHE_DIR/int8-peaks``), and later loads
of the same files quantize each linear smoothed as it is read, in one pass.

Other checkpoint formats (``pytorch_model.bin``) load in float32 and are quantized afterwards.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from backend.engine import int8_linear
from backend.engine.exact_attention import use_exact_attention
from backend.engine.int8_linear import (
    group_peak,
    input_peaks,
    product_groups,
    quantize_linears,
    quantize_model,
    quantized_linears,
)
from backend.errors import ConfigError
from backend.services.cache_home import cache_home, keep, key_digest
from backend.services.calibration_cache import files_fingerprint
from backend.services.target_source import TargetSource

logger = logging.getLogger(__name__)

Tensors = Iterator[tuple[str, torch.Tensor, str]]  # (parameter name, values, stored format)
PEAKS_FORMAT = 2  # bump when what the calibration pass records changes
CALIBRATION_TEXT = Path(__file__).resolve().parents[2] / "assets" / "int8_calibration.txt"


@dataclass(frozen=True, slots=True)
class Int8Load:
    model: Any
    description: str  # what was re-quantized and how, for the load info


def calibration_sequences(tokenizer: Any) -> list[list[int]]:
    """The bundled calibration text (prose, dialogue, facts, a list, code, a table), one token
    sequence per paragraph."""
    paragraphs = CALIBRATION_TEXT.read_text(encoding="utf-8").split("\n\n")
    return [list(tokenizer(text).input_ids) for text in paragraphs if text.strip()]


def load_int8(
    source: TargetSource, config: Any, calibration: list[list[int]] | None = None
) -> Int8Load:
    """The target at ``source`` with every decoder linear and the readout in int8; with
    ``calibration`` (token sequences), smoothed by the input peaks measured on them."""
    if not int8_linear.available():
        raise ConfigError(
            "int8 quantization needs torch's x86 quantized engine (fbgemm), which this build lacks",
            hint="load without quantization",
        )
    loaded = _load(source, config, calibration)
    logger.info("int8 target: %s", loaded.description)
    return loaded


def _load(source: TargetSource, config: Any, calibration: list[list[int]] | None) -> Int8Load:
    """Pass one places every tensor; with calibration text and no stored peaks, the model
    reads the text and pass two re-reads the linears' tensors to quantize them smoothed."""
    from transformers import AutoModelForCausalLM

    if source.is_gguf:
        path = Path(source.display)
        model = _empty_model(config)
        stored = _load_stored(
            model, lambda wanted: _gguf_tensors(path, model, wanted), source, calibration
        )
        return Int8Load(model, _describe(model, f"GGUF {_formats(stored)}", calibration))
    shards = sorted(Path(source.directory).glob("*.safetensors"))
    if shards:
        model = _empty_model(config)
        stored = _load_stored(
            model, lambda wanted: _safetensors_tensors(shards, wanted), source, calibration
        )
        return Int8Load(model, _describe(model, _formats(stored), calibration))
    model = AutoModelForCausalLM.from_pretrained(source.directory, dtype=torch.float32).eval()
    quantize_model(model, calibration)
    return Int8Load(model, _describe(model, "float32 (loaded whole, then quantized)", calibration))


def _load_stored(
    model: nn.Module,
    read: Callable[[set[str] | None], Tensors],
    source: TargetSource,
    calibration: list[list[int]] | None,
) -> Counter:
    """Fill ``model`` from ``read(wanted)``; smoothed by calibration peaks kept from an earlier
    load of the same files (one pass), or measured now and kept (two passes)."""
    store = _peaks_file(source, calibration) if calibration else None
    known = _read_peaks(store, model) if store is not None else None
    stored = _fill(model, read(None), known or {})
    if calibration and known is None:  # the int8 model reads the text; the linears again
        peaks = input_peaks(model, quantized_linears(model), calibration)
        _fill(model, read(set(_quantized_linears(model))), peaks)
        if store is not None:
            _write_peaks(store, model, peaks)
    return stored


def _peaks_file(source: TargetSource, calibration: list[list[int]]) -> Path:
    """Where the input peaks of these weight files on this calibration text are kept: they
    depend on the files, the text, and the arithmetic of the model that read it."""
    key = {
        "format": PEAKS_FORMAT,
        "files": files_fingerprint(source.display),
        "calibration": hashlib.sha256(json.dumps(calibration).encode()).hexdigest(),
        "smoothing": [int8_linear.SMOOTHING, int8_linear.SPIKE_SHARE],
        "activations": int8_linear.activation_range().to_json(),
        "torch": torch.__version__,
    }
    return cache_home() / "int8-peaks" / f"{key_digest(key)}.safetensors"


def _read_peaks(store: Path, model: nn.Module) -> dict[nn.Linear, torch.Tensor] | None:
    """The kept peaks by linear, or None when absent, unreadable or not this model's."""
    from safetensors.torch import load_file

    if not store.is_file():
        return None
    linears = _peak_names(model)
    try:
        saved = load_file(str(store))
    except Exception as err:  # a damaged file is measured again
        logger.warning("int8 calibration peaks at %s unreadable (%s): measuring again", store, err)
        return None
    if set(saved) != set(linears) or any(
        saved[name].shape != (linear.in_features,) for name, linear in linears.items()
    ):
        logger.warning("int8 calibration peaks at %s do not fit this model: measuring again", store)
        return None
    return {linear: saved[name] for name, linear in linears.items()}


def _write_peaks(store: Path, model: nn.Module, peaks: dict[nn.Linear, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    tensors = {name: peaks[linear].contiguous() for name, linear in _peak_names(model).items()}
    keep(store, lambda partial: save_file(tensors, str(partial)), "the int8 calibration peaks")


def _peak_names(model: nn.Module) -> dict[str, nn.Linear]:
    """Module name -> linear, for every linear quantized smoothed (the readout included)."""
    names = {module: name for name, module in model.named_modules()}
    return {names[linear]: linear for linear in quantized_linears(model)}


def _empty_model(config: Any) -> nn.Module:
    """The architecture with its parameters on ``meta`` and its buffers real."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval()


def _quantized_linears(model: nn.Module) -> dict[str, nn.Linear]:
    """Parameter name -> linear, for every linear whose weight becomes int8: the decoder's and
    an untied readout (one tied to the embedding is quantized from it once it is loaded)."""
    names = {module: name for name, module in model.named_modules()}
    linears = quantized_linears(model)
    if _tied(model):
        linears = linears[:-1]
    return {f"{names[linear]}.weight": linear for linear in linears}


def _tied(model: nn.Module) -> bool:
    return bool(getattr(model.config, "tie_word_embeddings", False))


def _stored_names(model: nn.Module) -> dict[str, str]:
    """Stored name -> parameter name where they differ: a tied pair may be stored under the
    readout's name only (safetensors keeps one name per shared tensor)."""
    if not _tied(model):
        return {}
    names = {module: name for name, module in model.named_modules()}
    readout = f"{names[model.get_output_embeddings()]}.weight"
    return {readout: f"{names[model.get_input_embeddings()]}.weight"}


def _fill(model: nn.Module, tensors: Tensors, peaks: dict[nn.Linear, torch.Tensor]) -> Counter:
    """Place every tensor ``tensors`` yields, linears smoothed by ``peaks`` where given (a second
    pass yields only the linears); returns the stored formats of the re-quantized ones."""
    quantized = _quantized_linears(model)
    groups = {linear: group for group in product_groups(model) for linear in group}
    waiting: dict[nn.Linear, torch.Tensor] = {}  # members read before the rest of their group
    renamed = _stored_names(model)
    stored: Counter = Counter()
    for name, tensor, form in tensors:
        name = renamed.get(name, name)
        linear = quantized.get(name)
        if linear is not None:
            stored[form] += 1
            waiting[linear] = tensor
            group = groups[linear]
            if all(member in waiting for member in group):
                quantize_linears(
                    group,
                    [waiting.pop(member) for member in group],
                    input_peak=group_peak(group, peaks),
                    spikes=linear is not model.get_output_embeddings(),
                )
            continue
        module_name, _, leaf = name.rpartition(".")
        try:
            module = model.get_submodule(module_name)
        except AttributeError:
            logger.debug("stored tensor %s has no place in the model: skipped", name)
            continue
        if leaf in module._parameters:
            module._parameters[leaf] = nn.Parameter(tensor.float(), requires_grad=False)
        elif leaf in module._buffers:
            module._buffers[leaf] = tensor.float()
    readout = model.get_output_embeddings()
    if _tied(model):  # share the embedding's weight, then quantize
        readout.weight = model.get_input_embeddings().weight
        quantize_linears([readout], tied=True, input_peak=peaks.get(readout), spikes=False)
        stored["tied to the embedding"] += 1
    use_exact_attention(model)
    missing = [name for name, p in model.named_parameters() if p.device.type == "meta"]
    if missing:
        raise ConfigError(
            f"the target's files hold no values for {len(missing)} parameters "
            f"(e.g. {', '.join(missing[:3])})",
            hint="load without --quantize int8 to let transformers read this checkpoint",
        )
    return stored


def _safetensors_tensors(shards: list[Path], wanted: set[str] | None = None) -> Tensors:
    """Each stored tensor (only those named in ``wanted``, when given)."""
    from safetensors import safe_open

    for shard in shards:
        with safe_open(str(shard), framework="pt") as handle:
            for name in handle.keys():
                if wanted is not None and name not in wanted:
                    continue
                tensor = handle.get_tensor(name)
                yield name, tensor, str(tensor.dtype).removeprefix("torch.")


def _gguf_tensors(path: Path, model: nn.Module, wanted: set[str] | None = None) -> Tensors:
    """Each GGUF tensor dequantized, renamed and re-laid out as transformers' GGUF loading
    does (its tensor processors and name map). With ``wanted`` (parameter names), a tensor
    whose name maps outside it is skipped before it is dequantized."""
    import numpy as np
    from gguf import GGUFReader, dequantize
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
    )

    reader = GGUFReader(str(path))
    field = reader.fields["general.architecture"]
    architecture = bytes(field.parts[field.data[0]]).decode()
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=model.config.to_dict())
    names = get_gguf_hf_weights_map(model, processor)
    for tensor in reader.tensors:
        known = names.get(tensor.name)  # a processor may rename; then only its result tells
        if wanted is not None and known is not None and known not in wanted:
            continue
        weights = dequantize(tensor.data, tensor.tensor_type)
        result = processor.process(weights=weights, name=tensor.name, tensor_key_mapping=names)
        if result.name not in names or (wanted is not None and names[result.name] not in wanted):
            continue
        values = torch.from_numpy(np.ascontiguousarray(result.weights, dtype=np.float32))
        yield names[result.name], values, tensor.tensor_type.name


def _formats(stored: Counter) -> str:
    return ", ".join(f"{form} ({count})" for form, count in stored.most_common())


def _describe(model: nn.Module, stored: str, calibration: list[list[int]] | None) -> str:
    count = sum(1 for module in model.modules() if "int8_product" in module.__dict__)
    smoothing = (
        f"smoothed by input peaks on {sum(map(len, calibration))} calibration tokens"
        if calibration
        else "smoothed by weight peaks (no calibration text)"
    )
    return (
        f"{count} linears re-quantized to int8 (per-row scales, {smoothing}) from {stored}; "
        "embedding and norms in float32"
    )
