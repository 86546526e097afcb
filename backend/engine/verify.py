"""Acceptance of a draft tree against the target's logits. Pure functions: no
model, no cache.

Paper symbols: p = the target's processed distribution at a node (what vanilla decoding would
sample from), q = the distribution a child was drafted from. Walk down from the root; at each
node try its children in order: accept child x with probability min(1, p(x)/q(x)), otherwise
replace p by norm(max(p - q, 0)) and try the next; if none is accepted, draw the bonus token
from what is left of p. Deterministic (top-k) drafts are the case q = a point mass on x: accept
with p(x), else zero p(x) and renormalise. Sampled drafts are i.i.d. draws from the head's q at
their parent. Either way every emitted token is distributed exactly as p.

Each child is tried with the distribution it was drawn from (``child_proposals``): a head child
with the head's q at its parent (a point mass for a top-k draft), a child copied from the context
with a point mass. A child both sources proposed is tried twice, as the head's draw and then as
the context's point mass: two proposals in a row, each tried against what the previous
rejections left of p, so the rule stays exact for any mix (the order depends only on proposals
already tried).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from backend.config import SamplingConfig
from backend.engine.sampling import processed_probs, sample_from, uniform
from backend.engine.tree import CONTEXT, HEAD, DraftTree


@dataclass(frozen=True, slots=True)
class Acceptance:
    accepted_nodes: tuple[int, ...]  # tree node indices along the accepted path, root excluded
    token_ids: tuple[int, ...]  # accepted draft tokens followed by the bonus token
    bonus_token_id: int

    @property
    def num_accepted_drafts(self) -> int:
        return len(self.accepted_nodes)

    @property
    def last_node(self) -> int:
        return self.accepted_nodes[-1] if self.accepted_nodes else 0


def greedy_accept(tree: DraftTree, target_logits: torch.Tensor) -> Acceptance:
    """Longest path whose every draft equals the target's argmax at its parent; bonus = argmax
    after the path's last node. target_logits: [N, V], row i = prediction after node i."""
    predicted = target_logits.argmax(dim=-1)  # [N]
    parents = tree.parents.clamp(min=0).to(predicted.device)
    correct = tree.token_ids.to(predicted.device) == predicted[parents]  # [N]
    correct[0] = True  # the root is given
    ancestors = tree.ancestors.to(predicted.device)
    path_ok = ~(ancestors & ~correct[None, :]).any(dim=1)  # every node on the path correct
    depth_ok = torch.where(path_ok, tree.depths.to(predicted.device), -1)
    best = int(depth_ok.argmax())
    path = ancestors[best].nonzero().flatten().tolist()[1:]  # ascending = root to best
    tokens = tree.token_ids[path].tolist() if path else []
    bonus = int(predicted[best])
    return Acceptance(tuple(path), tuple(tokens) + (bonus,), bonus)


def sample_accept(
    tree: DraftTree,
    target_logits: torch.Tensor,
    sampling: SamplingConfig,
    generator: torch.Generator,
) -> Acceptance:
    """Lossless recursive rejection sampling down the tree (see module docstring)."""
    probs = processed_probs(target_logits, sampling).cpu()  # [N, V]
    children = tree.children()
    tokens = tree.token_ids.tolist()
    node, path = 0, []
    while True:
        p = probs[node].clone()
        head_drawn = any(tree.source_of(child) & HEAD for child in children[node])
        head_q = _proposal(tree, node, p.numel()) if head_drawn else None
        accepted_child = None
        for child in children[node]:
            token = tokens[child]
            for q in child_proposals(tree, child, head_q):
                q_token = 1.0 if q is None else float(q[token])  # a deterministic draft: q = 1
                if uniform(generator) * q_token < float(p[token]):  # min(1, p/q)
                    accepted_child = child
                    break
                p = rejection_residual(p, q, token)
                total = float(p.sum())
                if total <= 0.0:  # nothing left outside what was rejected: only rounding
                    accepted_child = child
                    break
                p /= total
            if accepted_child is not None:
                break
        if accepted_child is None:
            bonus = sample_from(p, generator)
            return Acceptance(tuple(path), tuple(tokens[i] for i in path) + (bonus,), bonus)
        path.append(accepted_child)
        node = accepted_child


def rejection_residual(p: torch.Tensor, q: torch.Tensor | None, token: int) -> torch.Tensor:
    """What p becomes after rejecting ``token`` drafted from q, before normalising:
    max(p - q, 0), and for a deterministic draft (q = None, a point mass) p with ``token``
    zeroed. Any other residual (for a sampled draft, p with the token zeroed) is not lossless;
    the statistical tests swap this function to show they catch that."""
    if q is None:
        p[token] = 0.0
        return p
    return (p - q).clamp_(min=0.0)


def child_proposals(
    tree: DraftTree, child: int, head_q: torch.Tensor | None
) -> list[torch.Tensor | None]:
    """The distributions ``child`` was drawn from, tried in this order (None = a point mass):
    the head's q at its parent (None for a top-k draft), then for a context copy a point mass
    (not twice: after a rejected point mass the token has no probability left)."""
    source = tree.source_of(child)
    proposals: list[torch.Tensor | None] = [head_q] if source & HEAD else []
    if source & CONTEXT and not (source & HEAD and head_q is None):
        proposals.append(None)
    return proposals


def _proposal(tree: DraftTree, node: int, vocab_size: int) -> torch.Tensor | None:
    """The draft distribution of ``node``'s children over the target vocabulary, if sampled."""
    if tree.proposal_probs is None:
        return None
    q = torch.zeros(vocab_size)
    q[tree.proposal_ids.cpu()] = tree.proposal_probs[node].float().cpu()
    return q
