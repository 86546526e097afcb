"""The draft head's precision: bfloat16 on a CPU where that drafts faster, whatever the
target's.

Drafts are only proposals: the target verifies every one in its own precision, so the reply is
exactly what it would be with a float32 head; only how often drafts hold can move, by the
rounding of the head's own arithmetic. On a CPU with native bfloat16 math, a head whose weights
outgrow the caches is bound by memory traffic and drafts about twice as fast from half the
bytes; a small head runs slower (the conversions outweigh the traffic saved). So it is timed at
load, once per pair and machine (the choice is kept with the tree costs, which are timed with
it).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable

import torch

from backend.config import TreeConfig
from backend.engine.drafter import EagleDrafter
from backend.engine.target import TargetRunner
from models.heads.base import DraftHead

LOWER = torch.bfloat16
MIN_GAIN = 1.15  # bfloat16 must draft at least this much faster to be used
TIMED_SHAPES = (
    TreeConfig(total_tokens=5, depth=4, top_k=1),
    TreeConfig(total_tokens=8, depth=4, top_k=2),
)
PROMPT_TOKENS = 32
REPEATS = 5


def can_lower(head: DraftHead) -> bool:
    """A float32 head on a CPU whose torch build computes bfloat16 natively."""
    dtype, device = head.dtype_device()
    if device.type != "cpu" or dtype != torch.float32:
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def lowered_copy(head: DraftHead) -> DraftHead:
    """A bfloat16 copy of ``head`` sharing the target modules it borrows (never copied)."""
    shared = {id(module): module for module in head.borrowed_modules()}
    twin = copy.deepcopy(head, memo=shared).to(LOWER)
    for module in twin.modules():  # its KV and attention stay float32 (see layers.Attention)
        if hasattr(module, "attention_dtype"):
            module.attention_dtype = torch.float32
    return twin


@torch.inference_mode()
def prompt_features(runner: TargetRunner) -> tuple[torch.Tensor, torch.Tensor]:
    """A short prompt and the target's features for it: what the timed drafts start from."""
    prompt = torch.arange(PROMPT_TOKENS, dtype=torch.long) % runner.vocab_size
    return prompt, runner.prefill(prompt, runner.new_cache(), with_features=True).features


@torch.inference_mode()
def drafting_s(
    drafter: EagleDrafter, prompt: torch.Tensor, features: torch.Tensor, repeats: int = REPEATS
) -> float:
    """Seconds to draft each of TIMED_SHAPES once after ``prompt``, best of ``repeats``."""
    best = float("inf")
    for attempt in range(repeats + 1):  # the first is a warm-up
        drafter.begin(prompt, 0, features)
        start = time.perf_counter()
        for shape in TIMED_SHAPES:
            drafter.propose(0, shape)
        if attempt:
            best = min(best, time.perf_counter() - start)
    return best


def choose_head_precision(
    runner: TargetRunner,
    head: DraftHead,
    drafter: EagleDrafter,
    known: str | None,
    make_drafter: Callable[[DraftHead], EagleDrafter],
) -> tuple[DraftHead, EagleDrafter]:
    """The head and drafter to draft with: a bfloat16 copy when ``known`` says so (an earlier
    load of the same pair chose it), or, with nothing known, when it times at least MIN_GAIN
    faster here; else the ones given."""
    if not can_lower(head) or known == "target":
        return head, drafter
    lowered = lowered_copy(head)
    lowered_drafter = make_drafter(lowered)
    if known is None:
        prompt, features = prompt_features(runner)
        full_s = drafting_s(drafter, prompt, features)
        if full_s <= MIN_GAIN * drafting_s(lowered_drafter, prompt, features):
            return head, drafter
    return lowered, lowered_drafter


def precision_name(head: DraftHead | None, target_dtype: torch.dtype) -> str:
    """ "bfloat16" when the head drafts in bfloat16 under a target of another dtype, else
    "target" (the target's own dtype)."""
    if head is None:
        return "target"
    dtype, _ = head.dtype_device()
    return str(dtype).removeprefix("torch.") if dtype != target_dtype else "target"
