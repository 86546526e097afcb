"""What smaller tree shapes would have accepted, replayed on the nodes of the tree just verified.

A greedy verification tells, for every node, whether its token is the target's choice after its
parent. A smaller shape (fewer nodes, levels or branches per node) drafts (nearly) a subset of
the same nodes: the draft head is deterministic, so the same root gives the same candidates and
scores. Its accepted length is then the deepest node of that subset whose whole path is right.
This measures every smaller shape on every round, so the tuner compares shapes by what they
actually accept instead of extrapolating one acceptance rate per level.

The subset of shape (N, D, K): nodes at depth <= D whose path only takes the head's K best
children at every level, then the N - 1 best of those by cumulative score (how the drafter
selects). The drafter also prunes each level to its K best-scored nodes before expanding them;
that pruning is not replayed, so a replayed narrow shape may keep a node the real one would not
have drafted (an optimistic estimate only for shapes much narrower than the verified one).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from backend.config import TreeConfig
from backend.engine.tree import DraftTree


def covers(verified: TreeConfig, candidate: TreeConfig) -> bool:
    """Whether ``candidate``'s nodes are (approximately) a subset of ``verified``'s."""
    return (
        candidate.total_tokens <= verified.total_tokens
        and candidate.depth <= verified.depth
        and candidate.top_k <= verified.top_k
    )


def replay_accepted(
    tree: DraftTree, correct: torch.Tensor, candidates: Sequence[TreeConfig]
) -> list[int]:
    """Accepted drafts each candidate shape would have had on this round (greedy decoding).

    ``correct[i]``: node i's token is the target's choice after its parent (root True). Plain
    Python: the trees are small, and this runs on every round."""
    if not candidates:
        return []
    parents, depths, verdicts = tree.parents.tolist(), tree.depths.tolist(), correct.tolist()
    right = [True] * len(parents)  # every node on the path is the target's choice
    for node in range(1, len(parents)):  # parents precede children
        right[node] = verdicts[node] and right[parents[node]]
    if tree.ranks is None or tree.scores is None:  # a chain: shapes keep a prefix
        reach = max(depth for depth, ok in zip(depths, right) if ok)
        return [min(reach, c.depth, c.total_tokens - 1) for c in candidates]
    ranks, scores = tree.ranks.tolist(), tree.scores.float().tolist()
    widest = [ranks[0]] * len(parents)  # the largest rank on the path, the node's own included
    for node in range(1, len(parents)):
        widest[node] = max(widest[parents[node]], ranks[node])
    best_first = sorted(range(1, len(parents)), key=lambda node: -scores[node])  # stable
    reached = []
    for shape in candidates:
        kept, deepest = 0, 0
        for node in best_first:  # the drafter keeps the N - 1 best-scored eligible nodes
            if kept == shape.total_tokens - 1:
                break
            if depths[node] <= shape.depth and widest[node] < shape.top_k:
                kept += 1
                deepest = max(deepest, depths[node]) if right[node] else deepest
        reached.append(deepest)
    return reached


def replay_heads(
    verified: TreeConfig | None,
    shapes: Sequence[TreeConfig],
    tree: DraftTree,
    correct: torch.Tensor | None,
    accepted: int,
) -> dict[TreeConfig | None, int]:
    """Accepted drafts of every shape among ``shapes`` that a round verifying ``verified`` (the
    head's ``tree``; None: no head drafts) covers, and 0 for no head drafts at all: replayed
    from the greedy verdicts (``correct``, the head's nodes), else as a chain's prefixes of its
    ``accepted`` drafts (sampled chains)."""
    covered = [s for s in shapes if verified is not None and covers(verified, s)]
    replayed: dict[TreeConfig | None, int] = {None: 0}
    if covered and correct is not None:
        replayed.update(zip(covered, replay_accepted(tree, correct, covered)))
    else:
        replayed.update((s, min(accepted, s.depth)) for s in covered)
    return replayed
