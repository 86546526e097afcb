"""The feature cache: what it gives back equals what the target gives (to float16 and top-k),
the target runs once per token however many epochs read it, an interrupted fill or run resumes
exactly, and a cache is never read for other examples or another target."""

from __future__ import annotations

import json

import pytest
import torch

from backend.errors import ConfigError
from models.training import feature_cache
from models.training.data import TokenizedExample
from models.training.feature_cache import CacheSettings, FeatureCache, shard_plan
from models.training.losses import BatchSpec, eagle3_loss, target_batch
from models.training.trainer import TrainConfig, train_head
from tests.factories import easy_llama_pair, tiny_head
from tests.training.interruptions import fails_on_call, stops_at_step

LAYERS = 8
VOCAB = 64


@pytest.fixture(scope="module")
def target():
    return easy_llama_pair(vocab_size=VOCAB, num_layers=LAYERS)[0]


@pytest.fixture(scope="module")
def examples():
    """Sequences of different lengths; the first two tokens carry no loss (a prompt)."""
    generator = torch.Generator().manual_seed(0)
    out = []
    for number in range(12):
        length = 10 + (number * 7) % 15
        ids = torch.randint(3, VOCAB, (length,), generator=generator).tolist()
        out.append(TokenizedExample(ids, [0, 0] + [1] * (length - 2)))
    return out


def _count_forwards(target) -> list[int]:
    calls = [0]
    target.model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def _spec(head, readout_only: bool, max_length: int = 20) -> BatchSpec:
    columns = head.to_target_ids(torch.arange(head.config.draft_vocab_size))
    layers = head.feature_layers(LAYERS)
    return BatchSpec(layers, 0, max_length, torch.device("cpu"), columns, readout_only)


@pytest.mark.parametrize("readout_only", [True, False])
def test_cached_batches_equal_the_targets_to_float16(target, examples, tmp_path, readout_only):
    """With every column kept, a cached batch gives the loss the target's own batch gives;
    with fewer, the kept columns are the target's most likely ones, renormalised."""
    head = tiny_head("eagle3", target, draft_vocab_size=48)
    spec = _spec(head, readout_only)
    full = FeatureCache.open_or_fill(
        CacheSettings(tmp_path / "full", top_k=48), target, examples, spec
    )
    picked = [5, 0, 11, 3]
    direct = target_batch(target, [examples[i] for i in picked], spec)
    cached = full.batch(picked)
    assert torch.equal(cached.input_ids, direct.input_ids)
    assert torch.equal(cached.loss_mask, direct.loss_mask)
    real = torch.zeros_like(direct.loss_mask)  # padding is not cached (nor trained on)
    for row, index in enumerate(picked):
        real[row, : len(examples[index].input_ids)] = True
    torch.testing.assert_close(cached.features[real], direct.features[real], rtol=1e-3, atol=1e-3)
    assert torch.equal(cached.targets.in_vocab[real], direct.targets.in_vocab[real])
    assert torch.equal(cached.targets.argmax[real], direct.targets.argmax[real])
    torch.testing.assert_close(
        eagle3_loss(head, cached, ttt_steps=3).loss,
        eagle3_loss(head, direct, ttt_steps=3).loss,
        rtol=2e-3,
        atol=2e-3,
    )
    small = FeatureCache.open_or_fill(
        CacheSettings(tmp_path / "top4", top_k=4), target, examples, spec
    )
    cut = small.batch(picked).targets
    best = direct.targets.probs.topk(4, dim=-1)
    assert torch.equal(cut.columns[real], best.indices[real])
    expected = best.values / best.values.sum(-1, keepdim=True)
    torch.testing.assert_close(cut.probs[real], expected[real], rtol=2e-3, atol=2e-3)
    assert 0.0 < small.kept_mass < full.kept_mass <= 1.0 + 1e-4


def test_an_interrupted_fill_continues_at_its_first_missing_shard(
    target, examples, tmp_path, monkeypatch
):
    monkeypatch.setattr(feature_cache, "SHARD_TOKENS", 40)  # several shards of a few examples
    lengths = [min(len(e.input_ids), 20) for e in examples]
    plan = shard_plan(lengths, 40)
    assert len(plan) > 3 and [i for shard in plan for i in shard] == list(range(len(examples)))
    head = tiny_head("eagle3", target, draft_vocab_size=48)
    spec = _spec(head, readout_only=True)
    settings = CacheSettings(tmp_path / "cache", top_k=8, batch_size=2)
    original = feature_cache.target_batch
    monkeypatch.setattr(feature_cache, "target_batch", fails_on_call(original, 5))
    with pytest.raises(KeyboardInterrupt):
        FeatureCache.open_or_fill(settings, target, examples, spec)
    written = json.loads((settings.directory / "manifest.json").read_text())["shards"]
    assert 0 < len(written) < len(plan)
    monkeypatch.setattr(feature_cache, "target_batch", original)
    calls = _count_forwards(target)
    resumed = FeatureCache.open_or_fill(settings, target, examples, spec)
    missing = sum(-(-len(shard) // 2) for shard in plan[len(written) :])
    assert calls[0] == missing  # the written shards are not run again
    fresh = FeatureCache.open_or_fill(
        CacheSettings(tmp_path / "fresh", 8, 2), target, examples, spec
    )
    for index in range(len(examples)):
        a, b = resumed.batch([index]), fresh.batch([index])
        assert torch.equal(a.features, b.features) and torch.equal(a.targets.probs, b.targets.probs)
    with pytest.raises(ConfigError, match="other examples"):
        FeatureCache.open_or_fill(settings, target, examples[1:], spec)


def test_features_beyond_float16_are_kept_in_bfloat16(target, examples, tmp_path, monkeypatch):
    monkeypatch.setattr(feature_cache, "FLOAT16_LIMIT", 1e-3)
    head = tiny_head("eagle3", target, draft_vocab_size=48)
    spec = _spec(head, readout_only=True)
    cache = FeatureCache.open_or_fill(CacheSettings(tmp_path, top_k=8), target, examples, spec)
    assert cache.layout.feature_dtype == "bfloat16"
    direct = target_batch(target, examples[:1], spec)
    torch.testing.assert_close(cache.batch([0]).features, direct.features, rtol=1e-2, atol=1e-2)


def _cached_config(tmp_path, name: str, **overrides) -> TrainConfig:
    settings = dict(
        kind="eagle3",
        out_dir=tmp_path / name,
        steps=9,  # three epochs of the 12 examples
        batch_size=4,
        lr=3e-3,
        draft_vocab_size=48,
        ttt_steps=3,
        draft_readout_only=True,
        max_length=20,
        checkpoint_every=0,
        show_progress=False,
        cache_dir=tmp_path / "cache",
        cache_top_k=16,
    )
    settings.update(overrides)
    return TrainConfig(**settings)


def test_cached_run_resumed_at_step_k_matches_an_uninterrupted_one(target, examples, tmp_path):
    """The target runs only while the cache fills (once per token): never in later epochs, and
    not at all in a resumed run; a run stopped at step 4 and resumed ends with the parameters of
    a run that went straight through."""
    calls = _count_forwards(target)
    straight = train_head(target, None, examples, _cached_config(tmp_path, "straight"))
    filled = calls[0]
    assert 0 < filled <= len(examples) // 4 + 2  # the fill's batches (and its layout sample)
    assert straight.timing.batches_from == "cache" and straight.timing.steps == 9

    config = _cached_config(tmp_path, "stopped", checkpoint_every=3)
    with pytest.raises(KeyboardInterrupt):
        train_head(target, None, examples, config, stops_at_step(4))
    resumed = train_head(
        target, None, examples, _cached_config(tmp_path, "stopped", checkpoint_every=3, resume=True)
    )
    assert calls[0] == filled  # the cache was filled once and read by all three runs
    assert resumed.resumed_from == 4 and resumed.steps == 9
    assert resumed.losses == pytest.approx(straight.losses, rel=1e-5, abs=1e-6)
    for key, value in straight.head.state_dict().items():
        torch.testing.assert_close(resumed.head.state_dict()[key], value, rtol=1e-5, atol=1e-6)
    summary = json.loads((tmp_path / "stopped" / "training_summary.json").read_text())
    assert summary["timing"]["batches_from"] == "cache" and summary["timing"]["steps"] == 5
