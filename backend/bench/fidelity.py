"""How closely a quantized target follows its float32 original on held-out text (``bench
--quantize int8 --fidelity``): at every position of every prompt, both read the same text
(teacher forcing) and their next-token distributions are compared.

- top-1 agreement: the share of positions where both rank the same token first;
- mean KL: KL(float32 || quantized) in nats, averaged over the positions.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch


@dataclass(frozen=True, slots=True)
class Fidelity:
    top1_agreement: float
    mean_kl: float  # nats per token
    tokens: int  # positions compared

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@torch.inference_mode()
def compare(quantized: Any, reference: Any, sequences: list[list[int]]) -> Fidelity:
    """Top-1 agreement and mean KL of ``quantized`` against ``reference`` over ``sequences``."""
    agree = positions = 0
    kl_sum = 0.0
    for ids in sequences:
        tokens = torch.tensor([ids])
        ours = quantized(input_ids=tokens).logits[0].float().log_softmax(-1)  # [L, V]
        theirs = reference(input_ids=tokens).logits[0].float().log_softmax(-1)  # [L, V]
        agree += int((ours.argmax(-1) == theirs.argmax(-1)).sum())
        kl_sum += max(0.0, float((theirs.exp() * (theirs - ours)).sum()))  # >= 0 but for rounding
        positions += len(ids)
    if positions == 0:
        return Fidelity(1.0, 0.0, 0)
    return Fidelity(agree / positions, kl_sum / positions, positions)
