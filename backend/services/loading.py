"""Load a target (and optionally its head) ready for the engine: validation before any weight is
read, dtype and device choice, optional bitsandbytes quantization of the target, OOM mapping,
head binding and a warm-up forward. (The memory estimate shown before loading is in
``planning.py``.)

The dtype comes from ``dtypes.py`` (float32 on CPUs, bfloat16 on CUDA). Placement goes
through accelerate's ``device_map`` when one is given, so a model larger than one GPU spreads
over several.

Loading is a generator of ``Progress`` events that returns the ``LoadedPair``
(``pair = yield from load_steps(prepared)``), so callers stream progress without threads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch

from backend.config import LoadConfig, TreeConfig
from backend.engine.attention_layout import check_rollback
from backend.engine.autotune import HEAD_SHAPES
from backend.engine.calibration import (
    CostModel,
    RoundThreads,
    calibrate,
    calibration_steps,
    fastest_round_threads,
)
from backend.engine.decoder_projections import (
    describe_decoder,
    known_decoder_forms,
    projection_bytes,
    speed_up_decoder,
)
from backend.engine.device import choose_device
from backend.engine.drafter import EagleDrafter
from backend.engine.engine import Engine
from backend.engine.head_precision import choose_head_precision, precision_name
from backend.engine.progress import drain, relay
from backend.engine.projection_forms import Forms, describe, speed_up, speed_up_readout
from backend.engine.target import TargetRunner
from backend.errors import ConfigError, EagleChatError, ResourceError
from backend.events import PairInfo, Progress
from backend.services import calibration_cache, gguf_cache, tuning_cache
from backend.services.dtypes import resolve_dtype
from backend.services.int8_loading import calibration_sequences, load_int8
from backend.services.planning import available_ram
from backend.services.prompting import format_label, resolve_format, stop_spec
from backend.services.target_source import TargetSource, local_source, locate
from backend.services.validate import check_head_fits_target, read_target_config, text_config
from models.checkpoints import DAMAGED_HINT, build_head, check_safetensors_folder, read_raw
from models.heads.base import DraftHead, execution_device

logger = logging.getLogger(__name__)

_LOAD_STEPS = 5


@dataclass
class LoadedPair:
    """A loaded target, its tokenizer and optional head, and the engine built on them once."""

    model: Any
    tokenizer: Any
    head: DraftHead | None
    engine: Engine  # runner, drafter, stop rules, tree costs and tuning state
    target_path: str
    head_path: str | None
    info: PairInfo
    prompt_format: str = "auto"  # see backend/services/prompting.py
    # time spent at load measuring the round costs (0: read from disk)
    calibration_s: float = 0.0
    readout_forms: str = (
        "stock"  # the CPU forms of the output projections (engine/projection_forms.py)
    )
    decoder_forms: str = "stock"  # the decoder projections' (engine/decoder_projections.py)
    round_threads: RoundThreads = RoundThreads()  # CPU threads of plain steps, drafted rounds
    tuning_key: dict | None = None  # where the tuner's state is kept (services/tuning_cache.py)
    tuning_restored: bool = False  # the tuner started from what an earlier run learned


@dataclass
class PreparedLoad:
    """Everything checked before the target's weights are read (cheap: configs and the head)."""

    config: LoadConfig
    target_path: str
    head_path: str | None
    target_config: Any
    head: DraftHead | None


def resolve_location(repo_or_path: str, gguf_file: str | None = None) -> str:
    """A local directory or .gguf file as is; otherwise a Hub id resolved from the local cache.
    With ``gguf_file`` the result is that file's path inside the folder."""
    repo_id, gguf_file, local = locate(repo_or_path, gguf_file)
    if local is not None:
        return local
    from backend.services.hub import resolve_local

    return local_source(resolve_local(repo_id, gguf_file=gguf_file), gguf_file).display


def quantization_config(kind: str, compute_dtype: torch.dtype) -> Any:
    """bitsandbytes' settings for ``kind``; None for none and for int8 (int8_loading.py)."""
    if kind in ("none", "int8"):
        return None
    from transformers import BitsAndBytesConfig

    # The 8-bit CPU path logs a cast warning on every matmul.
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    if kind == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute_dtype
    )


def prepare(
    config: LoadConfig, target_path: str, head_path: str | None, expected_kind: str | None = None
) -> PreparedLoad:
    """Read the target's config.json and the head, and check they fit: no target weights yet."""
    target_config = read_target_config(target_path, config.trust_remote_code)
    check_rollback(target_config)
    head = None
    if head_path is not None:
        head = build_head(read_raw(head_path))
        check_head_fits_target(
            head.config, target_config, head_name=str(config.head), expected_kind=expected_kind
        )
    return PreparedLoad(config, target_path, head_path, target_config, head)


def _pretrained_kwargs(config: LoadConfig, dtype: torch.dtype, device: torch.device) -> dict:
    """``from_pretrained`` arguments: dtype, quantization and where the weights go."""
    kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": config.trust_remote_code}
    quant = quantization_config(config.quantization, dtype)
    if quant is not None:
        kwargs["quantization_config"] = quant
    if config.device_map:
        kwargs["device_map"] = config.device_map
    elif quant is not None or device.type != "cpu":
        kwargs["device_map"] = {"": str(device)}
    return kwargs


def _weights_label(
    config: LoadConfig, source: TargetSource, quantized: bool, dtype_name: str, converted: bool
) -> str:
    if config.quantization == "int8":
        return "weights, re-quantized to int8 tensor by tensor"
    if source.is_gguf:
        return f"GGUF weights, dequantized to {dtype_name}"
    what = f"{config.quantization} weights" if quantized else f"{dtype_name} weights"
    return f"{what} (GGUF file converted at an earlier load)" if converted else what


def _load_target(
    prepared: PreparedLoad, dtype: torch.dtype, device: torch.device
) -> Generator[Progress, None, tuple[Any, Any, str]]:
    """Tokenizer, then the target's weights: load errors become clear messages. A GGUF file is
    read from its kept conversion when there is one, and kept after its first float32 load.
    int8 weights are read tensor by tensor into their int8 form (int8_loading.py). Returns the
    tokenizer, the model and what was re-quantized ("" unless int8)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config, target_path = prepared.config, prepared.target_path
    kwargs = _pretrained_kwargs(config, dtype, device)
    dtype_name = str(dtype).removeprefix("torch.")
    original = local_source(target_path)
    converted = gguf_cache.converted_source(original)
    source = converted or original
    kwargs = {**kwargs, **source.pretrained_kwargs()}
    if source.is_gguf:  # the config read at validation: one whole-metadata read fewer
        kwargs["config"] = prepared.target_config
    quantized = kwargs.get("quantization_config") is not None
    what = _weights_label(config, source, quantized, dtype_name, converted is not None)
    yield Progress("load", 1, _LOAD_STEPS, "steps", "tokenizer")
    with _load_errors(config, target_path):
        tokenizer = AutoTokenizer.from_pretrained(
            source.directory,
            trust_remote_code=config.trust_remote_code,
            **source.pretrained_kwargs(),
        )
        stage = "quantize" if quantized or config.quantization == "int8" else "load"
        yield Progress(stage, 2, _LOAD_STEPS, "steps", f"target {what}")
        if not source.is_gguf:
            check_safetensors_folder(source.directory)
        if config.quantization == "int8":
            architecture = text_config(prepared.target_config)
            loaded = load_int8(source, architecture, calibration_sequences(tokenizer))
            return tokenizer, loaded.model, loaded.description
        model = AutoModelForCausalLM.from_pretrained(source.directory, **kwargs).eval()
    if source.is_gguf and gguf_cache.worth_keeping(model):
        yield Progress("load", 2, _LOAD_STEPS, "steps", "keeping the converted GGUF weights")
        gguf_cache.keep_conversion(source, model, tokenizer)
    return tokenizer, model, ""


def load_steps(prepared: PreparedLoad) -> Generator[Progress, None, LoadedPair]:
    """Tokenizer, weights (quantized if asked), head binding, warm-up; yields one event per step."""
    config = prepared.config
    device = choose_device()
    dtype = resolve_dtype(config.dtype, device)
    dtype_name = str(dtype).removeprefix("torch.")
    tokenizer, model, weights = yield from _load_target(prepared, dtype, device)
    yield Progress("load", 3, _LOAD_STEPS, "steps", "binding the head")
    head, drafter = prepared.head, None
    if head is not None:
        head, drafter = bind_head(model, head, dtype)
    runner = TargetRunner(model, drafter.feature_indices if drafter else ())
    key = _calibration_key(prepared, runner.device, dtype_name)
    cached = calibration_cache.load(key)
    if drafter is not None:  # before the projection forms: they are chosen per dtype
        head, drafter = _drafting_precision(model, runner, head, drafter, cached)
    head_precision = precision_name(head, dtype)
    forms = speed_up_projections(model, head, config, cached.forms if cached else {})
    yield Progress("warmup", 4, _LOAD_STEPS, "steps", "warm-up forward")
    with _load_errors(config, prepared.target_path):
        warmup(runner, drafter)
        threads = round_threads(runner, drafter, config, cached)
        record = partial(
            calibration_cache.Calibration,
            forms=forms,
            head_precision=head_precision,
            round_threads=threads,
        )
        costs, calibration_s = yield from calibrate_pair(
            runner, drafter, key, cached, record, threads
        )
    prompt_format = resolve_format(tokenizer, config.prompt_format)
    stops = stop_spec(model, tokenizer, prompt_format)
    engine = Engine(runner, drafter, tokenizer, stops, costs, round_threads=threads)
    tuning = "resumed" if _resume_tuning(engine, key, calibration_s) else "new"
    info = replace(
        pair_info(config, model, head, runner, dtype_name, format_label(prompt_format)),
        head_dtype="" if head_precision == "target" else head_precision,
        tree_tuning=tuning,
        weights=weights,
    )
    yield Progress("warmup", 5, _LOAD_STEPS, "steps", "ready")
    logger.info("loaded %s", info)
    return LoadedPair(
        model=model,
        tokenizer=tokenizer,
        head=head,
        engine=engine,
        target_path=prepared.target_path,
        head_path=prepared.head_path,
        info=info,
        prompt_format=prompt_format,
        calibration_s=calibration_s,
        readout_forms=describe_projections(forms),
        decoder_forms=describe_decoder(forms),
        round_threads=threads.resolved(torch.get_num_threads()),
        tuning_key=key,
        tuning_restored=tuning == "resumed",
    )


def _calibration_key(prepared: PreparedLoad, device: torch.device, dtype_name: str) -> dict:
    config = prepared.config
    return calibration_cache.calibration_key(
        prepared.target_path,
        prepared.head_path,
        device,
        dtype_name,
        config.quantization,
        {
            "projections": f"{config.readout}/{config.decoder_forms}",
            "round_threads": config.round_threads,
        },
    )


def round_threads(
    runner: TargetRunner,
    drafter: EagleDrafter | None,
    config: LoadConfig,
    cached: calibration_cache.Calibration | None,
) -> RoundThreads:
    """The CPU thread counts for plain steps and drafted rounds: as asked (both), as an earlier
    load of this pair chose, or timed now (calibration.py). Neither set (every thread) without a
    head, where the timing would be paid at every load, or off the CPU."""
    if config.round_threads:
        count = min(config.round_threads, torch.get_num_threads())
        return RoundThreads(count, count)
    if drafter is None or runner.device.type != "cpu":
        return RoundThreads()
    if cached is not None and cached.round_threads is not None:
        return cached.round_threads
    threads = fastest_round_threads(runner, drafter)
    logger.info(
        "plain steps run on %d, drafted rounds on %d of %d CPU threads",
        threads.plain,
        threads.drafted,
        torch.get_num_threads(),
    )
    return threads


def _drafting_precision(
    model: Any,
    runner: TargetRunner,
    head: DraftHead,
    drafter: EagleDrafter,
    cached: calibration_cache.Calibration | None,
) -> tuple[DraftHead, EagleDrafter]:
    """The head (and its drafter) in the precision it drafts in: as an earlier load of this
    pair chose, else timed now (backend/engine/head_precision.py)."""
    head, drafter = choose_head_precision(
        runner,
        head,
        drafter,
        cached.head_precision if cached else None,
        lambda lowered: EagleDrafter(lowered, model.config.num_hidden_layers),
    )
    logger.info("the head drafts in %s", head.dtype_device()[0])
    return head, drafter


def _resume_tuning(engine: Engine, key: dict, calibration_s: float) -> bool:
    """Start from what the tuner learned of this pair last time (the first reply then drafts
    as well as the last one did), and keep what it learns now at exit; True when there was
    something to resume."""
    restored = tuning_cache.restore(engine, key, with_times=calibration_s == 0.0)
    if restored:
        logger.info("the tree tuner resumes from what earlier runs of this pair learned")
    tuning_cache.save_at_exit(engine.policies, key)
    return restored


def pair_info(
    config: LoadConfig,
    model: Any,
    head: DraftHead | None,
    runner: TargetRunner,
    dtype_name: str,
    prompt_format: str,
) -> PairInfo:
    """What the UI and the CLI show about a loaded pair."""
    return PairInfo(
        target=config.target,
        head=config.head,
        head_kind=head.kind.value if head is not None else None,
        architecture=type(model).__name__,
        dtype=dtype_name,
        device=str(runner.device),
        quantization=config.quantization,
        parameters=int(model.num_parameters()),
        vocab_size=int(runner.vocab_size),
        max_context=int(runner.max_positions),
        prompt_format=prompt_format,
    )


def bind_head(model, head: DraftHead, dtype: torch.dtype) -> tuple[DraftHead, EagleDrafter]:
    """Place the head beside the lm_head it reads (unquantized, in the target's compute dtype)
    and borrow the target's modules. With accelerate offloading (weights on ``meta``), that is
    the device the lm_head is run on; a head is never left on ``meta``."""
    lm_head = model.get_output_embeddings()
    device = execution_device(lm_head)
    if device.type == "meta":
        raise ConfigError(
            "the target's lm_head is offloaded with no device to run it on, so the draft head "
            "cannot be placed",
            hint="load without a device_map, or with one that keeps lm_head on a CPU or GPU",
        )
    head = head.to(device=device, dtype=dtype)
    head.bind_target(model.get_input_embeddings(), lm_head)
    return head, EagleDrafter(head, model.config.num_hidden_layers)


def load_pair(config: LoadConfig, expected_kind: str | None = None) -> LoadedPair:
    """Blocking load from local folders or the Hub cache (no download), progress discarded."""
    head_path = resolve_location(config.head) if config.head else None
    target_path = resolve_location(config.target, config.gguf_file)
    return drain(load_steps(prepare(config, target_path, head_path, expected_kind)))


def speed_up_projections(
    model: Any, head: DraftHead | None, config: LoadConfig, known: dict[str, Forms]
) -> dict[str, Forms]:
    """The CPU forms of the target's readout and of the head's own lm_head (EAGLE-3; EAGLE-1/2
    heads borrow the target's): ``config.readout`` forced, or those ``known`` from the
    calibration cache, or timed now; then the target's decoder projections, unless
    ``config.decoder_forms`` is "stock"."""
    force = None if config.readout == "auto" else config.readout
    if config.quantization == "int8":  # the target's linears run their int8 form
        forms = {"target": {False: "stock", True: "stock"}}
    else:
        forms = {"target": speed_up_readout(model, force, known.get("target"))}
    own = getattr(head, "lm_head", None)
    if own is not None and own is not model.get_output_embeddings():
        forms["head"] = speed_up(own, force, known.get("head"))
    if config.decoder_forms == "auto" and config.quantization != "int8":
        forms.update(speed_up_decoder(model, known_decoder_forms(known), _room_to_pack(model)))
    return forms


PACK_SHARE = 0.5  # packed decoder weights may take at most this share of the RAM left


def _room_to_pack(model: Any) -> bool:
    """Whether a second, packed copy of the decoder projections fits easily in the RAM left
    (unknown RAM: no)."""
    return projection_bytes(model) < PACK_SHARE * available_ram()


def describe_projections(forms: dict[str, Forms]) -> str:
    """``"1 row: stock, more: packed; head: ..."`` for the settings and the bench."""
    label = describe(forms["target"])
    if "head" in forms:
        label += f"; head: {describe(forms['head'])}"
    return label


def calibrate_pair(
    runner: TargetRunner,
    drafter: EagleDrafter | None,
    key: dict,
    cached: calibration_cache.Calibration | None,
    record: Callable[[CostModel], calibration_cache.Calibration],
    threads: RoundThreads,
) -> Generator[Progress, None, tuple[CostModel, float]]:
    """The round auto-tuner's device costs, at load rather than in the first reply: read from
    the on-disk cache when this pair was timed on this machine before, else measured with
    progress and saved with the projection forms they were measured with (without a head only
    verification is timed: context drafts need nothing else). Returns the costs and the
    seconds spent measuring (0 when cached). ``record`` makes what is saved: the new costs
    with what the load chose alongside (projection forms, head precision, round threads);
    everything is timed on the ``threads`` the engine will run each kind of round on."""
    if cached is not None:
        yield Progress("calibrate", 1, 1, "steps", "round costs for this machine read from cache")
        return cached.costs, 0.0
    message = "timing verification for the round auto-tuner (once per model and machine)"
    shapes = HEAD_SHAPES if drafter is not None else ()
    total = calibration_steps(has_drafter=drafter is not None, shapes=shapes)
    start = time.perf_counter()
    costs = yield from relay(
        calibrate(runner, drafter, shapes, threads=threads),
        lambda done: Progress("calibrate", done, total, "steps", message),
    )
    seconds = time.perf_counter() - start
    calibration_cache.save(key, record(costs))
    return costs, seconds


@torch.inference_mode()
def warmup(runner: TargetRunner, drafter: EagleDrafter | None) -> None:
    """One tiny prefill, draft and tree verification, so the first real request pays no kernel
    or projection-form set-up (also when the calibration comes from the cache), and a broken
    placement or dtype fails here, at load time, not in the middle of a chat."""
    prompt = torch.tensor([0, 1], dtype=torch.long)
    cache = runner.new_cache()
    step = runner.prefill(prompt, cache, with_features=drafter is not None)
    if drafter is not None:
        drafter.begin(prompt, 1, step.features)
        tree = drafter.propose(1, TreeConfig(total_tokens=4, depth=2, top_k=2))
        runner.verify(tree, cache, with_features=True)


@contextmanager
def _load_errors(config: LoadConfig, path: str) -> Iterator[None]:
    """Map library failures during loading to typed errors (OOM, missing bitsandbytes, files)."""
    hint = "try quantization 4bit or 8bit, a smaller model, or device_map=auto"
    what = f"{config.target} ({config.dtype}, quantization {config.quantization})"
    try:
        yield
    except EagleChatError:
        raise
    except torch.OutOfMemoryError as err:
        raise ResourceError(f"out of memory loading {what}", hint=hint) from err
    except RuntimeError as err:
        if "can't allocate memory" in str(err):  # the CPU allocator's message
            raise ResourceError(f"out of memory loading {what}", hint=hint) from err
        raise
    except ImportError as err:
        if "gguf" in str(err).lower():
            raise ConfigError(
                f"cannot read the GGUF target {path}: {err}",
                hint="pip install gguf (or pip install -e .[gemma])",
            ) from err
        raise ConfigError(
            f"quantization {config.quantization} is not available: {err}",
            hint="install bitsandbytes, or load without quantization",
        ) from err
    except (OSError, ValueError) as err:
        raise ConfigError(f"cannot load the target from {path}: {err}") from err
    except Exception as err:
        if type(err).__name__ != "SafetensorError":
            raise
        raise ConfigError(f"cannot read the weights of {path}: {err}", hint=DAMAGED_HINT) from err
