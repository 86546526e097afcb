"""Fused q/k/v and gate/up products (``StackedLinears``): the same outputs as the separate
linears, one copy of the weights, and nothing changed for training, saving or moving a head."""

from __future__ import annotations

import copy

import pytest
import torch

from backend.engine import kv
from models.checkpoints import load_head, save_head
from models.heads.config import HeadKind
from tests.factories import tiny_head, tiny_target


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama", num_layers=8)


def inputs(head, target, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    width = head.fc.in_features if head.kind is HeadKind.EAGLE3 else head.config.hidden_size
    features = torch.randn(5, width, generator=generator)
    tokens = torch.randint(0, target.config.vocab_size, (1, 6), generator=generator)
    return features, tokens


def run(head, target, seed: int = 0) -> torch.Tensor:
    """A prompt pass (causal, several rows) then one draft step, through a fresh cache."""
    features, tokens = inputs(head, target, seed)
    cache = kv.new_cache()
    out = head(head.project(features)[None], tokens[:, :5], torch.arange(5)[None], None, cache)
    step = head(out[:, -1:], tokens[:, 5:], torch.tensor([[5]]), None, cache)
    return torch.cat([head.logits(out), head.logits(step)], dim=1)


def train_pass(head, target) -> torch.Tensor:
    """A training forward: the whole sequence at once, no cache."""
    features, tokens = inputs(head, target)
    out = head(head.project(features)[None], tokens[:, :5], torch.arange(5)[None], None, None)
    return head.logits(out)


@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
def test_fused_heads_compute_what_the_separate_linears_do(target, kind) -> None:
    head = tiny_head(kind, target)
    with torch.inference_mode():
        before = run(head, target)
    assert head.fuse_projections()
    assert (
        all(stack.fused for stack in head.projection_stacks())
        and len(head.projection_stacks()) == 2
    )
    with torch.inference_mode():
        after = run(head, target)
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)


def test_fusion_keeps_one_copy_of_the_weights(target) -> None:
    head = tiny_head("eagle3", target)
    before = {k: v.clone() for k, v in head.state_dict().items()}
    head.fuse_projections()
    attention = head.midlayer.self_attn
    storages = {
        p.untyped_storage().data_ptr() for p in (attention.q_proj.weight, attention.v_proj.weight)
    }
    assert len(storages) == 1  # the parameters are blocks of the fused matrix
    after = head.state_dict()
    assert set(after) == set(before)  # the checkpoint keys stay
    for key, value in before.items():
        torch.testing.assert_close(after[key], value, rtol=0, atol=0)


def test_in_place_updates_reach_the_fused_product(target) -> None:
    head, other = tiny_head("eagle3", target, seed=1), tiny_head("eagle3", target, seed=2)
    head.fuse_projections()
    head.load_state_dict(other.state_dict())  # copies into the parameters in place
    assert all(stack.fused for stack in head.projection_stacks())
    with torch.inference_mode():
        torch.testing.assert_close(run(head, target), run(other, target), rtol=1e-5, atol=1e-5)


def test_a_moved_head_falls_back_to_separate_products(target) -> None:
    head = tiny_head("eagle1", target)
    head.fuse_projections()
    reference = copy.deepcopy(tiny_head("eagle1", target)).double()
    head = head.double()  # new storage for every parameter: the fusion no longer holds
    assert not any(stack.fused for stack in head.projection_stacks())
    target64 = copy.deepcopy(target).double()
    for each in (head, reference):
        each.bind_target(target64.get_input_embeddings(), target64.get_output_embeddings())
    with torch.inference_mode():
        torch.testing.assert_close(run(head, target), run(reference, target), rtol=0, atol=0)
    assert head.fuse_projections()  # fusing again works in the new dtype


def test_training_after_fusion_updates_the_same_weights(target) -> None:
    head, twin = tiny_head("eagle3", target), tiny_head("eagle3", target)
    head.fuse_projections()
    for each in (head, twin):
        each.train()
        optimizer = torch.optim.SGD(each.parameters(), lr=0.1)
        train_pass(each, target).logsumexp(-1).mean().backward()
        optimizer.step()
    q_fused, q_plain = head.midlayer.self_attn.q_proj.weight, twin.midlayer.self_attn.q_proj.weight
    torch.testing.assert_close(q_fused, q_plain, rtol=1e-5, atol=1e-6)
    assert not torch.equal(q_plain, tiny_head("eagle3", target).midlayer.self_attn.q_proj.weight)
    head.eval()
    assert all(
        stack.fused for stack in head.projection_stacks()
    )  # the step wrote into the fused matrix
    with torch.inference_mode():
        torch.testing.assert_close(
            run(head, target), run(twin.eval(), target), rtol=1e-4, atol=1e-5
        )


def test_a_fused_head_saves_and_loads(tmp_path, target) -> None:
    head = tiny_head("eagle3", target)
    head.fuse_projections()
    save_head(head, tmp_path)
    loaded = load_head(tmp_path)
    for key, value in head.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
def test_the_gathered_draft_step_computes_what_the_modules_do(target, kind) -> None:
    """The drafter's step (fused tensors gathered once, the head's own cache) against the
    head's forward on separate linears through a transformers cache: a prompt pass, a draft
    step and a two-node tree level."""
    plain, fused = tiny_head(kind, target), tiny_head(kind, target)
    for head in (plain, fused):
        head.bind_target(target.get_input_embeddings(), target.get_output_embeddings())
    assert fused.fuse_projections()
    with torch.no_grad():
        step = fused.draft_step()
    features, tokens = inputs(plain, target)
    outs = []
    for forward, cache in ((plain, kv.new_cache()), (step, kv.HeadCache())):
        with torch.inference_mode():
            out = forward(
                plain.project(features)[None], tokens[:, :5], torch.arange(5)[None], None, cache
            )
            one = forward(out[:, -1:], tokens[:, 5:], torch.tensor([[5]]), None, cache)
            bias = torch.zeros(1, 1, 2, 8)
            bias[..., 0, 7] = bias[..., 1, 6] = torch.finfo(torch.float32).min  # siblings
            level = forward(
                one.expand(1, 2, -1), tokens[:, :2], torch.tensor([[6, 6]]), bias, cache
            )
        outs.append(torch.cat([out, one, level], dim=1))
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)


def test_a_scaled_or_foreign_embedding_keeps_its_own_forward(target) -> None:
    """Gemma-style embeddings scale their lookup: the gathered step must call them, not index
    their table."""

    class ScaledEmbedding(torch.nn.Embedding):
        def forward(self, ids):
            return super().forward(ids) * 3.0

    head = tiny_head("eagle3", target)
    scaled = ScaledEmbedding(target.config.vocab_size, target.config.hidden_size)
    head.bind_target(scaled, target.get_output_embeddings())
    ids = torch.tensor([[1, 2]])
    with torch.no_grad():
        torch.testing.assert_close(head.embedder()(ids), scaled.weight[ids] * 3.0)
    head.bind_target(target.get_input_embeddings(), target.get_output_embeddings())
    with torch.no_grad():
        torch.testing.assert_close(head.embedder()(ids), target.get_input_embeddings().weight[ids])
