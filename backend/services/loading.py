"""Load a target (and optionally its head) ready for the engine: path resolution, dtype and
device choice, optional bitsandbytes quantization of the target, head validation and binding.

Defaults: float32 on CPU (bf16 matmuls are slow on CPUs without bf16 hardware, and exact greedy
identity is a float32 property), bfloat16 on CUDA. Placement goes through accelerate's
``device_map`` when one is given, so a model larger than one GPU spreads over several.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from backend.config import LoadConfig
from backend.engine.drafter import EagleDrafter
from backend.engine.target import TargetRunner
from backend.errors import ConfigError, EagleChatError, ResourceError
from backend.services.validate import check_head_fits_target
from models.checkpoints import build_head, read_raw
from models.heads.base import DraftHead

logger = logging.getLogger(__name__)


@dataclass
class LoadedPair:
    """A loaded target, its tokenizer and optional head, with the engine objects built once."""

    model: Any
    tokenizer: Any
    head: DraftHead | None
    runner: TargetRunner
    drafter: EagleDrafter | None
    eos_ids: tuple[int, ...]
    target_path: str
    head_path: str | None
    info: dict[str, Any] = field(default_factory=dict)


def default_device() -> torch.device:
    """The one place a default device is chosen: the first GPU if any, else the CPU."""
    return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def resolve_location(repo_or_path: str) -> str:
    """A local directory as is; otherwise a Hub id resolved from the local cache."""
    if Path(repo_or_path).expanduser().is_dir():
        return str(Path(repo_or_path).expanduser())
    from backend.services.hub import resolve_local

    return resolve_local(repo_or_path)


def quantization_config(kind: str, compute_dtype: torch.dtype):
    if kind == "none":
        return None
    from transformers import BitsAndBytesConfig

    if kind == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute_dtype
    )


def load_pair(config: LoadConfig) -> LoadedPair:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = default_device()
    dtype = resolve_dtype(config.dtype, device)
    target_path = resolve_location(config.target)
    head_path = resolve_location(config.head) if config.head else None

    # Read and check the head before spending time on the target's weights.
    raw_head = read_raw(head_path) if head_path else None
    head = build_head(raw_head) if raw_head is not None else None

    kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": config.trust_remote_code}
    quant = quantization_config(config.quantization, dtype)
    if quant is not None:
        kwargs["quantization_config"] = quant
    if config.device_map:
        kwargs["device_map"] = config.device_map
    elif quant is not None or device.type != "cpu":
        kwargs["device_map"] = {"": str(device)}
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            target_path, trust_remote_code=config.trust_remote_code
        )
        model = AutoModelForCausalLM.from_pretrained(target_path, **kwargs).eval()
    except torch.OutOfMemoryError as err:
        raise ResourceError(
            f"not enough memory to load {config.target} in {config.dtype}",
            hint="try --quantize 4bit or 8bit, a smaller model, or device_map=auto",
        ) from err
    except (OSError, ValueError) as err:
        if isinstance(err, EagleChatError):
            raise
        raise ConfigError(f"cannot load target model from {target_path}: {err}") from err

    drafter = None
    if head is not None:
        check_head_fits_target(head.config, model.config, head_name=str(config.head))
        lm_head = model.get_output_embeddings()
        # The head stays unquantized, in the target's compute dtype, beside the lm_head it uses.
        head = head.to(device=lm_head.weight.device, dtype=dtype)
        head.bind_target(model.get_input_embeddings(), lm_head)
        drafter = EagleDrafter(head, model.config.num_hidden_layers)
    runner = TargetRunner(model, drafter.feature_indices if drafter else ())
    info = {
        "target": config.target,
        "head": config.head,
        "head_kind": head.kind.value if head is not None else None,
        "dtype": str(dtype).removeprefix("torch."),
        "device": str(runner.device),
        "quantization": config.quantization,
        "architecture": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    logger.info("loaded %s", info)
    return LoadedPair(
        model=model, tokenizer=tokenizer, head=head, runner=runner, drafter=drafter,
        eos_ids=eos_token_ids(model, tokenizer), target_path=target_path,
        head_path=head_path, info=info,
    )  # fmt: skip


def eos_token_ids(model, tokenizer) -> tuple[int, ...]:
    """Every id that ends a reply: the generation config's EOS list and the tokenizer's EOS."""
    ids: set[int] = set()
    generation_config = getattr(model, "generation_config", None)
    configured = getattr(generation_config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(int(i) for i in configured)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return tuple(sorted(ids))
