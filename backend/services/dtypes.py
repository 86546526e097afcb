"""The one dtype resolver: which floating-point type a target loads in on a given device.

``auto`` means "the right default for this device", with the catalog's dtype as a preference:

- CUDA: the preferred dtype (the catalog's, usually bfloat16 or float16), else bfloat16 where
  the GPU supports it and float16 otherwise.
- CPU: float32, unless the catalog prefers a half type *and* the CPU has matrix units for it
  (AMX); without them half-precision forwards over several tokens run far slower than float32,
  and exact greedy identity with vanilla decoding is only guaranteed in float32.
- other devices: float32.

An explicit dtype (float32, bfloat16, float16) is always honoured. Every caller (loading, the
memory plan, the CLIs, the app's model manager, training, bench) goes through
:func:`choose_dtype` / :func:`resolve_dtype`.
"""

from __future__ import annotations

import torch

from backend.errors import ConfigError

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
# Half types a CPU runs fast only with these matrix units (torch.cpu.get_capabilities names).
_CPU_MATRIX_UNITS = {"bfloat16": "amx_bf16", "float16": "amx_fp16"}


def cpu_runs_fast(dtype_name: str) -> bool:
    """Whether this CPU has matrix hardware for ``dtype_name`` (float32 always counts).

    Deliberately strict: AVX-512 BF16 dot-product instructions alone do not make multi-token
    bf16 forwards reliably faster than float32 in PyTorch, so only AMX counts."""
    unit = _CPU_MATRIX_UNITS.get(dtype_name)
    if unit is None:
        return dtype_name == "float32"
    try:
        return bool(torch.cpu.get_capabilities().get(unit, False))
    except (AttributeError, RuntimeError):  # capability query missing on this build
        return False


def choose_dtype(requested: str, device: torch.device, preferred: str = "auto") -> str:
    """The dtype name to load in: ``requested`` unless it is "auto", else the device's default
    with ``preferred`` (the catalog's dtype, or "auto") honoured where the device runs it well."""
    if requested != "auto":
        if requested not in DTYPES:
            raise ConfigError(
                f"dtype must be auto|float32|bfloat16|float16, got {requested!r}",
                hint="auto picks float32 on CPUs and bfloat16 on GPUs",
            )
        return requested
    if device.type == "cuda":
        if preferred in DTYPES:
            return preferred
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    if device.type == "cpu" and preferred in DTYPES and cpu_runs_fast(preferred):
        return preferred
    return "float32"


def resolve_dtype(requested: str, device: torch.device, preferred: str = "auto") -> torch.dtype:
    """:func:`choose_dtype` as a torch dtype."""
    return DTYPES[choose_dtype(requested, device, preferred)]
