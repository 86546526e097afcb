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

    ``correct[i]``: node i's token is the target's choice after its parent (root True)."""
    if not candidates:
        return []
    ancestors = tree.ancestors.cpu()
    depths = tree.depths.cpu()
    right_path = ~(ancestors & ~correct.cpu()[None, :]).any(dim=1)  # [N]
    if tree.ranks is None or tree.scores is None:  # a chain: shapes keep a prefix
        reach = int(depths[right_path].max())
        return [min(reach, c.depth, c.total_tokens - 1) for c in candidates]
    limits = torch.tensor([[c.total_tokens - 1, c.depth, c.top_k] for c in candidates])
    ranks_ok = tree.ranks.cpu()[None, :] < limits[:, 2:3]  # [C, N]
    # a node is eligible when every node on its path (itself included) is within the width
    off_path = (~ranks_ok).to(torch.int32) @ ancestors.T.to(torch.int32)  # [C, N]
    eligible = (off_path == 0) & (depths[None, :] <= limits[:, 1:2])
    eligible[:, 0] = False  # the root is not a draft
    scores = tree.scores.cpu().float()[None, :].expand(len(candidates), -1)
    masked = torch.where(eligible, scores, torch.full_like(scores, -torch.inf))
    order = torch.sort(masked, dim=1, descending=True, stable=True).indices
    place = torch.empty_like(order)
    place.scatter_(1, order, torch.arange(order.shape[1]).expand_as(order))
    kept = eligible & (place < limits[:, 0:1])
    reached = torch.where(kept & right_path[None, :], depths[None, :], 0)
    return reached.amax(dim=1).tolist()  # amax: max(dim) takes a slow parallel path on CPUs


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
