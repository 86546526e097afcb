"""The drafter: turns a draft head into proposal trees, one per verification round.

Contract (fixed for every drafting strategy, so the loop never grows flags):
    begin(prompt_ids, first_token, prompt_features)   after the prefill
    propose(root_token, tree_config[, sampling, generator]) -> DraftTree   before each verification
    commit(new_tokens, accepted_features)              after each verification

Position convention: the head's sequence is the target's shifted by one. Head
position t takes (feature of target position t, token t+1) and predicts the feature of t+1.
So after ``commit`` the head cache holds exactly as many entries as the target cache, and its
last output (``_root_hidden``) predicts the children of the root token.

``begin`` runs the head over the prompt at once. Commits are lazy: the accepted (token,
feature) pairs are queued and fed to the head in one forward when the next tree is proposed.
Rounds that draft nothing (the autotuner's plain steps) then cost no head work at all, and the
head catches up in one batched forward later.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import torch

from backend.config import SamplingConfig, TreeConfig
from backend.engine import kv
from backend.engine.sampling import draw, processed_probs
from backend.engine.tree import Candidates, DraftTree, static_levels
from models.heads.base import DraftHead


class Drafter(Protocol):
    feature_indices: tuple[int, ...]

    def begin(
        self, prompt_ids: torch.Tensor, first_token: int, prompt_features: torch.Tensor
    ) -> None: ...

    def propose(
        self,
        root_token: int,
        tree: TreeConfig,
        sampling: SamplingConfig | None = None,
        generator: torch.Generator | None = None,
    ) -> DraftTree: ...

    def commit(self, new_tokens: list[int], accepted_features: torch.Tensor) -> None: ...


class EagleDrafter:
    """EAGLE-1/2/3 drafting; the kinds differ only in the head object it holds."""

    def __init__(self, head: DraftHead, num_target_layers: int) -> None:
        self.head = head
        fused = head.fuse_projections()
        with torch.no_grad():  # the fused inference matrices, gathered once
            self._step = head.draft_step() if fused else head
        self.feature_indices = head.feature_layers(num_target_layers)
        self.dtype, self.device = head.dtype_device()
        columns = torch.arange(head.config.draft_vocab_size, device=self.device)
        self._draft_ids = head.to_target_ids(columns)  # target id of each draft logit column
        self._cache = kv.HeadCache()
        self._committed = 0
        self._root_hidden: torch.Tensor | None = None  # [1, 1, H]
        self._pending_tokens: list[torch.Tensor] = []  # queued commits: next tokens [n]
        self._pending_features: list[torch.Tensor] = []  # and their features [n, F]

    # ---- 1. prefill ---------------------------------------------------------------------
    @torch.inference_mode()
    def begin(
        self, prompt_ids: torch.Tensor, first_token: int, prompt_features: torch.Tensor
    ) -> None:
        self._cache = kv.HeadCache()
        self._committed = 0
        self._pending_tokens, self._pending_features = [], []
        shifted = torch.cat([prompt_ids[1:].to(self.device), self._tokens([first_token])])
        self._queue(shifted, prompt_features)
        self._flush()  # the pass over the prompt is prompt work, not part of the first round

    # ---- 2. one round's tree ------------------------------------------------------------
    @torch.inference_mode()
    def propose(
        self,
        root_token: int,
        tree: TreeConfig,
        sampling: SamplingConfig | None = None,
        generator: torch.Generator | None = None,
    ) -> DraftTree:
        """A tree of deterministic top-k drafts, or (``sampling`` given, temperature > 0) of
        drafts drawn from the head's own distribution, which the target accepts far more often
        when its distribution is flat (acceptance = 1 - TV(p, q) instead of p(top guess))."""
        self._flush()
        if tree.shape == "static":
            return self._propose_static(root_token, tree.depth)
        chain_depth = min(tree.depth, tree.total_tokens - 1)
        if sampling is not None and not sampling.greedy and generator is not None:
            branches = max(1, min(tree.top_k, (tree.total_tokens - 1) // tree.depth))
            if branches == 1:
                return self._propose_chain(root_token, chain_depth, sampling, generator)
            return self._propose_sampled(root_token, tree, branches, sampling, generator)
        if tree.top_k == 1 or tree.total_tokens == tree.depth + 1:
            return self._propose_chain(root_token, chain_depth)
        return self._propose_dynamic(root_token, tree)

    def _propose_chain(
        self,
        root_token: int,
        depth: int,
        sampling: SamplingConfig | None = None,
        generator: torch.Generator | None = None,
    ) -> DraftTree:
        """One path: the head's top-1 token per step (what the dynamic tree gives with
        top_k=1), or one draw from its q per step. No tree bookkeeping: each step's single
        query sees everything before it, so no mask is needed."""
        hidden, drafts, proposals = self._root_hidden, [], []
        for step in range(depth):
            logits = self.head.logits(hidden)[0, -1]  # [Vd]
            if sampling is None:
                token = logits.argmax()[None]  # [1] draft id
            else:
                q = processed_probs(logits, sampling)
                proposals.append(q)
                token = draw(q, generator).to(self.device)  # [1]
            drafts.append(token)
            if step + 1 < depth:
                positions = torch.full((1, 1), self._committed + step, device=self.device)
                target_id = self.head.to_target_ids(token)[None]
                hidden = self._step(hidden, target_id, positions, None, self._cache)
        tokens = torch.cat([self._tokens([root_token]), self.head.to_target_ids(torch.cat(drafts))])
        if not proposals:
            return DraftTree.chain(tokens)
        proposals.append(torch.zeros_like(proposals[-1]))  # the leaf has no children
        return DraftTree.chain(tokens, torch.stack(proposals), self._draft_ids)

    def _propose_dynamic(self, root_token: int, config: TreeConfig) -> DraftTree:
        """EAGLE-2: expand the best top_k frontier nodes per level by cumulative log-prob, then
        keep the global best ``total_tokens - 1`` candidates."""
        root_logp = self._log_probs(self._root_hidden)[0]  # [Vd]
        width = min(config.top_k, root_logp.numel())
        first = root_logp.topk(width)
        cand_tokens, cand_scores = [first.indices], [first.values]
        cand_parents = [torch.full((width,), -1, device=self.device)]
        cand_depths = [torch.ones(width, dtype=torch.long, device=self.device)]
        frontier = torch.arange(width, device=self.device)  # global candidate indices
        frontier_scores = first.values
        frontier_hidden = self._root_hidden.expand(1, width, -1)
        frontier_tokens = first.indices
        tree_mask = torch.zeros(width, 0, dtype=torch.bool, device=self.device)
        num_candidates = width
        for depth in range(1, config.depth):
            hidden, log_probs, tree_mask = self._expand(
                frontier_hidden, frontier_tokens, depth, tree_mask
            )
            top = log_probs.topk(width, dim=-1)  # [F, k]
            scores = (frontier_scores[:, None] + top.values).flatten()  # [F*k]
            cand_tokens.append(top.indices.flatten())
            cand_scores.append(scores)
            cand_parents.append(frontier.repeat_interleave(width))
            cand_depths.append(torch.full_like(scores, depth + 1, dtype=torch.long))
            best = scores.topk(width).indices  # next frontier among F*k children
            parent_slot = best // width
            frontier = num_candidates + best
            num_candidates += scores.numel()
            frontier_scores = scores[best]
            frontier_tokens = top.indices.flatten()[best]
            frontier_hidden = hidden[:, parent_slot]
            tree_mask = tree_mask[parent_slot]
        scores = torch.cat(cand_scores)
        # Stable sort: on equal scores the earlier (shallower) candidate wins, so a parent is
        # always kept when its child is (a child's score never exceeds its parent's).
        order = torch.sort(scores, descending=True, stable=True).indices
        chosen = order[: config.total_tokens - 1].sort().values
        tree = self._assemble(
            root_token,
            torch.cat(cand_tokens)[chosen],
            torch.cat(cand_parents)[chosen],
            torch.cat(cand_depths)[chosen],
            chosen,
            num_candidates,
        )
        candidates = Candidates(
            width,
            self.head.to_target_ids(torch.cat(cand_tokens)),
            torch.cat(cand_parents),
            scores.float(),
        )
        return dataclasses.replace(tree, candidates=candidates)

    def _propose_sampled(
        self,
        root_token: int,
        config: TreeConfig,
        branches: int,
        sampling: SamplingConfig,
        generator: torch.Generator,
    ) -> DraftTree:
        """``branches`` i.i.d. draws at the root, each continued as a chain of single draws.

        Lossless verification needs every node's children to be i.i.d. draws from the q it
        records, so nothing is pruned by value after drawing (unlike the top-k tree). Node
        layout is level by level: node 1 + (d-1)*B + b is branch b at depth d."""
        q = processed_probs(self._log_probs(self._root_hidden), sampling)  # [1, Vd]
        drawn = draw(q[0], generator, branches)  # i.i.d., duplicates allowed
        levels, proposals = [drawn.to(self.device)], [q.expand(branches, -1)]
        hidden = self._root_hidden.expand(1, branches, -1)
        tree_mask = torch.zeros(branches, 0, dtype=torch.bool, device=self.device)
        for depth in range(1, config.depth):
            hidden, log_probs, tree_mask = self._expand(hidden, levels[-1], depth, tree_mask)
            q = processed_probs(log_probs, sampling)  # [B, Vd]
            proposals.append(q)
            drawn = draw(q, generator)[:, 0]
            levels.append(drawn.to(self.device))
        depth_count = len(levels)
        node = torch.arange(branches * depth_count, device=self.device) + 1
        parents = torch.where(node <= branches, 0, node - branches)
        depths = (node - 1) // branches + 1
        size = 1 + branches * depth_count
        probs = torch.zeros(size, q.shape[-1], dtype=torch.float32, device=self.device)
        probs[0] = proposals[0][0]
        if depth_count > 1:  # row of a node = the q its child was drawn from
            probs[1 : 1 + branches * (depth_count - 1)] = torch.cat(proposals[1:])
        return DraftTree.from_parents(
            torch.cat([self._tokens([root_token]), self.head.to_target_ids(torch.cat(levels))]),
            torch.cat([torch.tensor([-1], device=self.device), parents]),
            torch.cat([torch.zeros(1, dtype=torch.long, device=self.device), depths]),
            proposal_probs=probs,
            proposal_ids=self._draft_ids,
        )

    def _propose_static(self, root_token: int, depth: int) -> DraftTree:
        """EAGLE-1: a fixed tree of top-k ranks per level."""
        levels = static_levels(depth)
        hidden = self._root_hidden
        level_logp = self._log_probs(hidden)  # [1, Vd] for the root
        tree_mask = torch.zeros(1, 0, dtype=torch.bool, device=self.device)
        tokens, parents, depths = [], [], []
        previous_first = 0  # node index of the previous level's first node (root = 0)
        next_first = 1
        for level_index, level in enumerate(levels):
            slots = torch.tensor([s for s, _ in level], device=self.device)
            ranks = torch.tensor([r for _, r in level], device=self.device)
            max_rank = int(ranks.max()) + 1
            top_ids = level_logp.topk(min(max_rank, level_logp.shape[-1]), dim=-1).indices
            level_tokens = top_ids[slots, ranks.clamp(max=top_ids.shape[-1] - 1)]
            tokens.append(level_tokens)
            parents.append(slots + previous_first)
            depths.append(torch.full_like(slots, level_index + 1))
            previous_first, next_first = next_first, next_first + len(level)
            if level_index + 1 < len(levels):
                parent_hidden = hidden[:, slots]
                hidden, level_logp, tree_mask = self._expand(
                    parent_hidden, level_tokens, level_index + 1, tree_mask[slots]
                )
        return DraftTree.from_parents(
            torch.cat([self._tokens([root_token]), self.head.to_target_ids(torch.cat(tokens))]),
            torch.cat([torch.tensor([-1], device=self.device), torch.cat(parents)]),
            torch.cat([torch.zeros(1, dtype=torch.long, device=self.device), torch.cat(depths)]),
        )

    def _expand(
        self,
        parent_hidden: torch.Tensor,  # [1, F, H] head outputs of the frontier's parents
        tokens: torch.Tensor,  # [F] draft ids of the frontier nodes
        depth: int,  # depth of the frontier nodes (root = 0)
        tree_mask: torch.Tensor,  # [F, M] bool: which earlier tree entries each node sees
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run the head on one tree level; returns outputs [1, F, H], log-probs [F, Vd] and the
        level's tree mask including itself [F, M + F]."""
        count = tokens.numel()
        tree_mask = torch.cat(
            [tree_mask, torch.eye(count, dtype=torch.bool, device=self.device)], dim=1
        )
        bias = torch.zeros(
            count, self._committed + tree_mask.shape[1], dtype=self.dtype, device=self.device
        )
        bias[:, self._committed :].masked_fill_(~tree_mask, torch.finfo(self.dtype).min)
        positions = torch.full((1, count), self._committed - 1 + depth, device=self.device)
        target_ids = self.head.to_target_ids(tokens)[None]
        hidden = self._step(parent_hidden, target_ids, positions, bias[None, None], self._cache)
        return hidden, self._log_probs(hidden), tree_mask

    def _assemble(
        self,
        root_token: int,
        draft_ids: torch.Tensor,  # [n] chosen candidates' draft ids
        global_parents: torch.Tensor,  # [n] candidate index of each parent (-1 = root)
        depths: torch.Tensor,  # [n] depth of each chosen candidate
        chosen: torch.Tensor,  # [n] ascending candidate indices
        num_candidates: int,
    ) -> DraftTree:
        node_of = torch.zeros(num_candidates + 1, dtype=torch.long, device=self.device)
        node_of[chosen + 1] = torch.arange(1, chosen.numel() + 1, device=self.device)
        parents = node_of[global_parents + 1]  # root (-1) maps to node 0
        return DraftTree.from_parents(
            torch.cat([self._tokens([root_token]), self.head.to_target_ids(draft_ids)]),
            torch.cat([torch.tensor([-1], device=self.device), parents]),
            torch.cat([torch.zeros(1, dtype=torch.long, device=self.device), depths]),
        )

    # ---- 3. after verification ------------------------------------------------------------
    def commit(self, new_tokens: list[int], accepted_features: torch.Tensor) -> None:
        """Queue the true features of the root and the accepted nodes, paired with the tokens
        that follow them (accepted drafts + bonus); the head reads them at the next propose."""
        self._queue(self._tokens(new_tokens), accepted_features)

    # ---- helpers ----------------------------------------------------------------------------
    def _queue(self, next_tokens: torch.Tensor, features: torch.Tensor) -> None:
        self._pending_tokens.append(next_tokens)
        self._pending_features.append(features)

    def _flush(self) -> None:
        """Drop the last tree's speculative entries and run the head over the queued pairs."""
        self._cache.truncate(self._committed)
        if not self._pending_tokens:
            return
        tokens = torch.cat(self._pending_tokens)
        features = torch.cat([f.to(self.device) for f in self._pending_features])
        self._pending_tokens, self._pending_features = [], []
        self._extend(tokens, features)

    def _extend(self, next_tokens: torch.Tensor, features: torch.Tensor) -> None:
        count = next_tokens.numel()
        hidden_in = self.head.project(features.to(self.device, self.dtype))[None]  # [1, n, H]
        positions = torch.arange(self._committed, self._committed + count, device=self.device)
        # None: causal over the cache and the new entries (no mask at all from an empty cache)
        out = self._step(hidden_in, next_tokens[None], positions[None], None, self._cache)
        self._committed += count
        self._root_hidden = out[:, -1:]

    def _log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.head.logits(hidden)[0].float(), dim=-1)

    def _tokens(self, ids: list[int]) -> torch.Tensor:
        return torch.tensor(ids, dtype=torch.long, device=self.device)
