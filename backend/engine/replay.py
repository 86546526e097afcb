"""What smaller tree shapes would have accepted, replayed on the round just verified.

The draft head is deterministic, so a smaller shape (fewer nodes, levels or branches per node)
drafted from the same root would have scored the same candidates. The drafter keeps every
candidate it scored (``DraftTree.candidates``), kept in the tree or not, so the shape's own
tree is rebuilt from them as the drafter builds it: each level's K best children of the K best
nodes of the level above, then the N - 1 best of all by cumulative score.

Which of those drafts the target accepts is read from the reply itself: at temperature 0 the
target's choices do not depend on what was drafted, so a shape accepts the longest of its paths
that the reply goes on to write. A node the round did not verify is judged once the reply has
gone that far, so every shape's count is exact, not only for the nodes both trees share.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from backend.config import TreeConfig
from backend.engine.tree import DraftTree


def covers(verified: TreeConfig, candidate: TreeConfig) -> bool:
    """Whether a round verifying ``verified`` scored every candidate ``candidate`` drafts."""
    return (
        candidate.total_tokens <= verified.total_tokens
        and candidate.depth <= verified.depth
        and candidate.top_k <= verified.top_k
    )


@dataclass(frozen=True, slots=True)
class Drafted:
    """One shape's drafts on a round, as token paths after the root (closed under parents)."""

    paths: frozenset[tuple[int, ...]]
    depth: int  # of the longest path

    def accepted(self, text: Sequence[int], start: int, final: bool) -> int | None:
        """Drafts accepted: the longest path the reply ``text`` writes from ``start`` on; None
        while the reply is too short to tell (``final``: it ended, take what it shows)."""
        reached = 0
        while reached < self.depth:
            if start + reached >= len(text):
                return reached if final else None
            if tuple(text[start : start + reached + 1]) not in self.paths:
                break
            reached += 1
        return reached


@dataclass(frozen=True, slots=True)
class _Pool:
    """A top-k tree's candidates as plain lists, read once per round for all its shapes."""

    width: int
    tokens: list[int]
    parents: list[int]
    scores: list[float]
    block: dict[int, int]  # an expanded node's first child

    @classmethod
    def of(cls, tree: DraftTree) -> _Pool:
        pool = tree.candidates
        assert pool is not None, "a top-k tree's candidates"
        parents = pool.parents.tolist()
        block = {parents[first]: first for first in range(0, len(parents), pool.width)}
        return cls(pool.width, pool.token_ids.tolist(), parents, pool.scores.tolist(), block)


def drafted(tree: DraftTree, shape: TreeConfig) -> Drafted | None:
    """The drafts ``shape`` would have made from ``tree``'s root; None when a node it would
    expand was not expanded by ``tree``'s shape (a wider level can rank it out)."""
    return _rebuild(_Pool.of(tree), shape)


def _rebuild(pool: _Pool, shape: TreeConfig) -> Drafted | None:
    """``drafted`` on candidates already read."""
    assert shape.top_k <= pool.width, "a wider top-k tree's candidates"
    block, scores = pool.block, pool.scores
    width, by_score = shape.top_k, lambda node: -scores[node]
    level = list(range(width))  # the root's best children
    scored, frontier = list(level), level
    for _ in range(1, shape.depth):
        if any(node not in block for node in frontier):
            return None
        level = [child for node in frontier for child in range(block[node], block[node] + width)]
        scored += level
        frontier = sorted(level, key=by_score)[:width]  # stable, as the drafter's topk
    kept = sorted(sorted(scored, key=by_score)[: shape.total_tokens - 1])
    return _paths(pool.tokens, pool.parents, kept)


def _paths(tokens: list[int], parents: list[int], nodes: list[int], root: int = -1) -> Drafted:
    """The token paths from ``root`` to ``nodes`` (closed under parents, a parent first)."""
    paths: dict[int, tuple[int, ...]] = {root: ()}
    for node in nodes:
        paths[node] = paths[parents[node]] + (tokens[node],)
    del paths[root]
    return Drafted(frozenset(paths.values()), max(map(len, paths.values()), default=0))


def decide(
    replayed: dict[TreeConfig | None, int | Drafted | None],
    text: Sequence[int],
    start: int,
    final: bool,
) -> bool:
    """Count, in place, the accepted drafts of every shape the reply ``text`` has decided;
    whether it has decided them all (``final``: it ended, take what it shows)."""
    undecided = False
    for shape, drafts in replayed.items():
        if isinstance(drafts, Drafted):
            count = drafts.accepted(text, start, final)
            replayed[shape] = drafts if count is None else count
            undecided |= count is None
    return not undecided


def replay_heads(
    verified: TreeConfig | None,
    shapes: Sequence[TreeConfig],
    tree: DraftTree,
    accepted: int,
    greedy: bool,
) -> dict[TreeConfig | None, int | Drafted | None]:
    """Every shape among ``shapes`` that a round verifying ``verified`` (the head's ``tree``;
    None: no head drafts) covers, and 0 for no head drafts at all: its drafts, whose accepted
    count the reply decides (greedy decoding), else a chain's prefixes of the ``accepted``
    drafts (sampled chains). A chain's own prefixes are decided at once."""
    covered = [s for s in shapes if verified is not None and covers(verified, s)]
    replayed: dict[TreeConfig | None, int | Drafted | None] = {None: 0}
    if greedy and tree.candidates is not None:
        own = _paths(tree.token_ids.tolist(), tree.parents.tolist(), list(range(1, tree.size)), 0)
        pool = _Pool.of(tree)
        replayed.update((s, own if s == verified else _rebuild(pool, s)) for s in covered)
    else:
        replayed.update((s, min(accepted, s.depth)) for s in covered)
    return replayed
