"""The contract every draft head meets, so one drafter and one verify loop serve all kinds.

A head is bound to its target after loading: it borrows the target's token embedding (when the
checkpoint carries none) and, for EAGLE-1/2, the target's lm_head. Borrowed modules are kept
outside the head's state_dict so saving writes only the head's own weights.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from models.heads.config import HeadConfig, HeadKind
from models.stacked_linears import StackedLinears

# (hidden [1, Q, H], token_ids [1, Q], position_ids [1, Q], attn_bias, cache) -> [1, Q, H]
DraftStep = Callable[..., torch.Tensor]


def execution_device(module: nn.Module) -> torch.device:
    """Where ``module`` computes: its weights' device, or, when accelerate offloaded them to CPU
    or disk (weights on ``meta``, loaded at each call), the device its dispatch hook runs it on.
    ``meta`` only when neither says more."""
    weight = next(module.parameters(), None)
    if weight is not None and weight.device.type != "meta":
        return weight.device
    hook = getattr(module, "_hf_hook", None)
    for part in [hook, *getattr(hook, "hooks", ())]:
        device = getattr(part, "execution_device", None)
        if device is not None:
            return torch.device(device if not isinstance(device, int) else f"cuda:{device}")
    return weight.device if weight is not None else torch.device("cpu")


class DraftHead(nn.Module):
    kind: HeadKind

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.config = config
        self._borrowed: dict[str, nn.Module] = {}

    # ---- binding to the target -----------------------------------------------------------
    def bind_target(self, embedding: nn.Module, lm_head: nn.Module) -> None:
        """Borrow what the head uses from its target (kept out of state_dict)."""
        self._borrowed = {"embedding": embedding, "lm_head": lm_head}
        # where the borrowed modules run and (lm_head) in what dtype: fixed once the target is
        # placed, and looked up on every draft step
        self._embedding_device = execution_device(embedding)
        weight = next(lm_head.parameters(), None) if lm_head is not None else None
        if weight is not None and not weight.is_floating_point():  # int8 weights: float input
            weight = next(embedding.parameters())
        self._lm_head_input = (  # an offloaded weight keeps its dtype on meta
            (execution_device(lm_head), weight.dtype) if weight is not None else (None, None)
        )

    def borrowed_modules(self) -> list[nn.Module]:
        """The target's modules this head uses (not its own: never saved, copied or cast)."""
        return [module for module in self._borrowed.values() if module is not None]

    @property
    def embedding(self) -> nn.Module:
        own = self._modules.get("embed_tokens")
        if own is not None:
            return own
        if "embedding" not in self._borrowed:
            raise RuntimeError("head has no embedding: call bind_target(target) first")
        return self._borrowed["embedding"]

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        own = self._modules.get("embed_tokens")
        if own is not None:
            return own(token_ids)
        # the target's may live on another device than the head (device_map)
        weight = self.fc.weight
        borrowed = self.embedding(token_ids.to(self._embedding_device))
        return borrowed.to(weight.device, weight.dtype)

    def embedder(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """``embed`` with its checks done now: a plain embedding table on the head's device and
        in its dtype is indexed directly (a scaled one, like Gemma's, keeps its own forward)."""
        module, weight = self.embedding, self.fc.weight
        table = getattr(module, "weight", None)
        if (
            type(module) is not nn.Embedding
            or module.max_norm is not None
            or hasattr(module, "_hf_hook")
            or (table.device, table.dtype) != (weight.device, weight.dtype)
        ):
            return self.embed
        return lambda token_ids: F.embedding(token_ids, table)

    def projection_stacks(self) -> list[StackedLinears]:
        """Each layer's q/k/v and gate/up (``StackedLinears``)."""
        return [
            part
            for module in self.modules()
            for part in vars(module).values()
            if isinstance(part, StackedLinears)
        ]

    def fuse_projections(self) -> bool:
        """Run each layer's q/k/v and gate/up as one product at inference; True if every stack
        fused. Idempotent; training and saving are unaffected."""
        return all([stack.fuse() for stack in self.projection_stacks()])

    def dtype_device(self) -> tuple[torch.dtype, torch.device]:
        """Where the head's own weights are; every head kind starts with its ``fc``."""
        return self.fc.weight.dtype, self.fc.weight.device

    # ---- what differs per kind -------------------------------------------------------------
    def feature_layers(self, num_target_layers: int) -> tuple[int, ...]:
        """Indices into transformers' ``hidden_states`` the head reads (L = final normed output)."""
        raise NotImplementedError

    def project(self, target_features: torch.Tensor) -> torch.Tensor:
        """Map captured target features [..., F] into the head's input hidden space [..., H]."""
        raise NotImplementedError

    def forward(
        self,
        hidden: torch.Tensor,  # [1, Q, H] feature of position t (projected or fed back)
        token_ids: torch.Tensor,  # [1, Q] target ids of token t+1
        position_ids: torch.Tensor,  # [1, Q] position t
        attn_bias: torch.Tensor | None,  # [1, 1, Q, past + Q] additive, None = causal
        cache,  # transformers cache holding the head's KV
    ) -> torch.Tensor:  # [1, Q, H]: predicted feature of position t+1 (fed back as is)
        return self.draft_step()(hidden, token_ids, position_ids, attn_bias, cache)

    def draft_step(self) -> DraftStep:
        """``forward`` with its tensors gathered now: under gradients the parameters as they
        are (training, through ``forward``); without, the fused inference matrices, gathered
        once by the drafter, which would otherwise spend more on module calls than on a
        one-token step's arithmetic. Valid until the head's weights get new storage (``.to()``,
        fusing): gather again after that."""
        raise NotImplementedError

    def logits(self, hidden_out: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [..., Vd] for the token after the predicted feature."""
        raise NotImplementedError

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Map draft-vocabulary ids to target ids (identity unless the draft vocab is reduced)."""
        return draft_ids
