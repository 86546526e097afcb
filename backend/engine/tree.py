"""The draft tree and everything derived from its shape.

Node 0 is the root: the last accepted ("bonus") token, not yet in the target's cache. Nodes are
ordered so that a parent always precedes its children; a node's position id is
``committed_length + depth`` and it attends to the committed prefix, its ancestors and itself.

A round's tree may merge two draft sources: the head's tree first, then chains copied from the
context (``with_chains``), each hung from the deepest node whose path it continues. Every node
records who proposed it (``sources``), because sampled verification must know, per child, the
distribution it was drawn from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from backend.engine.kv import visible_keys

HEAD, CONTEXT = 1, 2  # bits of DraftTree.sources: who proposed a node

# EAGLE-1's static tree: 25 drafted nodes + root, depth 5, widths 4/8/8/3/2. Each path lists
# the top-k rank chosen at every level below the root.
EAGLE1_STATIC_PATHS: tuple[tuple[int, ...], ...] = (
    (0,),
    (1,),
    (2,),
    (3,),
    (0, 0),
    (0, 1),
    (0, 2),
    (0, 3),
    (1, 0),
    (1, 1),
    (2, 0),
    (3, 0),
    (0, 0, 0),
    (0, 0, 1),
    (0, 0, 2),
    (0, 1, 0),
    (0, 1, 1),
    (1, 0, 0),
    (0, 2, 0),
    (2, 0, 0),
    (0, 0, 0, 0),
    (0, 0, 0, 1),
    (0, 0, 1, 0),
    (0, 0, 0, 0, 0),
    (0, 0, 0, 0, 1),
)


@dataclass(frozen=True, slots=True)
class Candidates:
    """A top-k tree's candidates in the order the drafter scored them: blocks of ``width``
    children per expanded node (the root's first), each block in rank order (the head's best
    first), a parent's block before its children's."""

    width: int  # children per expanded node
    token_ids: torch.Tensor  # [C] long, target vocabulary
    parents: torch.Tensor  # [C] long, the parent's candidate index; -1 for the root
    scores: torch.Tensor  # [C] float, cumulative draft log-prob


@dataclass(frozen=True, slots=True)
class DraftTree:
    token_ids: torch.Tensor  # [N] long, target vocabulary; [0] is the root
    parents: torch.Tensor  # [N] long, parent node index; -1 for the root
    depths: torch.Tensor  # [N] long, 0 for the root
    ancestors: torch.Tensor  # [N, N] bool, [i, j] = j is i itself or one of its ancestors
    # Sampled drafts only (temperature > 0): row i = the draft distribution node i's children
    # were drawn from, over the columns' target ids. None = deterministic (top-k) drafts.
    proposal_probs: torch.Tensor | None = None  # [N, Vd] float
    proposal_ids: torch.Tensor | None = None  # [Vd] long, target id of each column
    # Top-k trees only: every candidate the drafter scored, kept or not; the tuner rebuilds
    # what smaller shapes would have drafted from them (replay.py).
    candidates: Candidates | None = None
    # Per node, HEAD | CONTEXT bits: who proposed it (0 for the root). None = the head alone.
    sources: tuple[int, ...] | None = None

    @property
    def size(self) -> int:
        return int(self.token_ids.numel())

    @classmethod
    def root_only(cls, root_token: int, device: torch.device | str = "cpu") -> DraftTree:
        """The one-node tree of plain decoding."""
        return cls.from_parents(
            torch.tensor([root_token], device=device), torch.tensor([-1], device=device)
        )

    @classmethod
    def chain(
        cls,
        token_ids: torch.Tensor,
        proposal_probs: torch.Tensor | None = None,
        proposal_ids: torch.Tensor | None = None,
    ) -> DraftTree:
        """A single path: node i is the child of node i - 1."""
        size, device = token_ids.numel(), token_ids.device
        steps = torch.arange(size, device=device)
        return cls(
            token_ids=token_ids,
            parents=steps - 1,
            depths=steps,
            ancestors=torch.ones(size, size, dtype=torch.bool, device=device).tril_(),
            proposal_probs=proposal_probs,
            proposal_ids=proposal_ids,
        )

    @classmethod
    def from_parents(
        cls,
        token_ids: torch.Tensor,
        parents: torch.Tensor,
        depths: torch.Tensor | None = None,
        proposal_probs: torch.Tensor | None = None,
        proposal_ids: torch.Tensor | None = None,
    ) -> DraftTree:
        """Derive depths (unless given) and the ancestor matrix from parent links; parents
        precede children. With depths given the work is one tensor step per tree level."""
        size = token_ids.numel()
        device = token_ids.device
        ancestors = torch.eye(size, dtype=torch.bool, device=device)
        if depths is None:
            depths = torch.zeros(size, dtype=torch.long, device=device)
            for index, parent in enumerate(parents.tolist()[1:], start=1):
                depths[index] = depths[parent] + 1
        for depth in range(1, int(depths.max()) + 1 if size > 1 else 1):
            level = (depths == depth).nonzero().flatten()
            ancestors[level] |= ancestors[parents[level]]
        return cls(
            token_ids=token_ids,
            parents=parents,
            depths=depths,
            ancestors=ancestors,
            proposal_probs=proposal_probs,
            proposal_ids=proposal_ids,
        )

    @property
    def is_chain(self) -> bool:
        """Every node is its predecessor's child: tree attention is plain causal attention."""
        return bool(
            (self.parents == torch.arange(-1, self.size - 1, device=self.parents.device)).all()
        )

    def source_of(self, node: int) -> int:
        return HEAD if self.sources is None else self.sources[node]

    def with_chains(self, chains: Sequence[Sequence[int]]) -> DraftTree:
        """This tree with context ``chains`` (token ids after the root) merged in: each chain
        follows the existing nodes it repeats and continues as new nodes, appended after the
        head's, so the head's nodes keep their indices (the head's own tree, with its
        candidates, is what replay.py reads)."""
        tokens, parents = self.token_ids.tolist(), self.parents.tolist()
        depths = self.depths.tolist()
        sources = list(self.sources or (0,) + (HEAD,) * (self.size - 1))
        child = {(parent, token): node for node, (parent, token) in enumerate(zip(parents, tokens))}
        for chain in chains:
            node = 0
            for token in chain:
                next_node = child.get((node, token))
                if next_node is None:
                    next_node = len(tokens)
                    child[(node, token)] = next_node
                    tokens.append(token)
                    parents.append(node)
                    depths.append(depths[node] + 1)
                    sources.append(0)
                sources[next_node] |= CONTEXT
                node = next_node
        device = self.token_ids.device
        grown = DraftTree.from_parents(
            torch.tensor(tokens, device=device),
            torch.tensor(parents, device=device),
            torch.tensor(depths, device=device),
            self.proposal_probs,
            self.proposal_ids,
        )
        return dataclasses.replace(grown, sources=tuple(sources))

    def children(self) -> list[list[int]]:
        """Child node indices of every node, in node order (i.e. draft-score order)."""
        kids: list[list[int]] = [[] for _ in range(self.size)]
        for index, parent in enumerate(self.parents.tolist()):
            if parent >= 0:
                kids[parent].append(index)
        return kids


def tree_attention_bias(
    tree: DraftTree,
    committed: int,
    dtype: torch.dtype,
    device: torch.device,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """[1, 1, N, K + N] float additive mask: 0 where a node may attend, finfo.min elsewhere.

    K = committed, or with a sliding window only the last ``window - 1`` committed keys (what a
    windowed cache layer shows attention), so the mask is never as wide as a long prefix.
    A float mask (not bool) is used because it is exact with both sdpa and eager attention.
    """
    size = tree.size
    neg = torch.finfo(dtype).min
    first = committed - visible_keys(committed, sliding_window) if sliding_window else 0
    shown = committed - first
    allowed = torch.ones(size, shown + size, dtype=torch.bool, device=device)
    allowed[:, shown:] = tree.ancestors.to(device)
    if sliding_window is not None:
        # Positions, not slots: a tree key sits at committed + its depth.
        depths = tree.depths.to(device)
        query_pos = committed + depths[:, None]
        key_pos = torch.cat([torch.arange(first, committed, device=device), committed + depths])
        allowed &= (query_pos - key_pos[None, :]) < sliding_window
    bias = torch.zeros(size, shown + size, dtype=dtype, device=device)
    bias.masked_fill_(~allowed, neg)
    return bias[None, None]


def tree_position_ids(tree: DraftTree, committed: int, device: torch.device) -> torch.Tensor:
    return (tree.depths.to(device) + committed)[None, :]  # [1, N]


def static_levels(depth: int) -> list[list[tuple[int, int]]]:
    """EAGLE-1 static tree as levels: for each node of a level, (parent slot in the previous
    level, top-k rank). Level 0 parent slot refers to the root. Truncated to ``depth`` levels."""
    levels: list[list[tuple[int, ...]]] = []
    for path in EAGLE1_STATIC_PATHS:
        if len(path) <= depth:
            while len(levels) < len(path):
                levels.append([])
            levels[len(path) - 1].append(path)
    out: list[list[tuple[int, int]]] = []
    for level_index, level in enumerate(levels):
        previous = levels[level_index - 1] if level_index else [()]
        out.append([(previous.index(path[:-1]), path[-1]) for path in level])
    return out
