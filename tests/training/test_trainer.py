"""Head training on a tiny, easy target: losses fall, checkpoints load, resume is exact, the
training-time test unrolls exactly what the drafter runs, and a trained head speeds up the engine.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from backend.config import GenerationConfig
from backend.errors import ConfigError
from backend.frontends import train_cli
from models.checkpoints import load_head
from models.heads.layers import causal_bias
from models.training.checkpointing import STATE_NAME
from models.training.data import TokenizedExample
from models.training.losses import ttt_unroll
from models.training.trainer import TrainConfig, TrainProgress, train_head
from tests.factories import easy_llama_pair, tiny_head, tiny_target, tiny_tokenizer
from tests.training.interruptions import stops_at_step

PROMPT_LEN = 4


@pytest.fixture(scope="module")
def easy_target():
    return easy_llama_pair(vocab_size=64, num_layers=8)[0]


def _greedy_examples(target, count: int, new_tokens: int, seed: int) -> list[TokenizedExample]:
    """Random prompts and the target's own greedy continuations (loss on the continuation)."""
    generator = torch.Generator().manual_seed(seed)
    examples = []
    for _ in range(count):
        prompt = torch.randint(3, target.config.vocab_size, (1, PROMPT_LEN), generator=generator)
        with torch.no_grad():
            ids = target.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
                eos_token_id=None,
            )[0].tolist()
        examples.append(TokenizedExample(ids, [0] * PROMPT_LEN + [1] * (len(ids) - PROMPT_LEN)))
    return examples


@pytest.fixture(scope="module")
def examples(easy_target):
    return _greedy_examples(easy_target, count=16, new_tokens=20, seed=0)


def _config(tmp_path: Path, kind: str, **overrides) -> TrainConfig:
    settings = dict(
        kind=kind,
        out_dir=tmp_path / kind,
        steps=30,
        batch_size=4,
        lr=3e-3,
        checkpoint_every=10,
        show_progress=False,
        seed=0,
    )
    settings.update(overrides)
    return TrainConfig(**settings)


@pytest.mark.parametrize(
    ("kind", "extra"), [("eagle1", {}), ("eagle3", {"draft_vocab_size": 48, "ttt_steps": 4})]
)
def test_loss_falls_and_checkpoints_load_back(easy_target, examples, tmp_path, kind, extra):
    seen: list[TrainProgress] = []
    result = train_head(easy_target, None, examples, _config(tmp_path, kind, **extra), seen.append)
    first, last = sum(result.losses[:5]) / 5, sum(result.losses[-5:]) / 5
    assert last < 0.5 * first, result.losses
    assert seen[-1].accuracy > seen[0].accuracy and seen[-1].step == result.steps == 30
    assert len(result.accuracies) == (4 if kind == "eagle3" else 1)
    # the final head and every kept checkpoint are official-format heads
    final = load_head(tmp_path / kind)
    assert final.kind.value == kind
    for key, value in result.head.state_dict().items():
        assert torch.equal(final.state_dict()[key], value.cpu()), key
    kept = sorted(p.name for p in (tmp_path / kind).glob("checkpoint-*"))
    assert kept == ["checkpoint-20", "checkpoint-30"]  # keep_checkpoints=2
    assert load_head(tmp_path / kind / "checkpoint-20").kind.value == kind
    state = torch.load(tmp_path / kind / "checkpoint-20" / STATE_NAME, weights_only=True)
    assert state["step"] == 20 and len(state["losses"]) == 20
    summary = json.loads((tmp_path / kind / "training_summary.json").read_text())
    assert summary["steps"] == 30
    if kind == "eagle3":  # reduced vocabulary: d2t/t2d saved and consistent
        ids = final.to_target_ids(torch.arange(48))
        assert ids.unique().numel() == 48 and bool(final.t2d[ids].all())
        assert int(final.t2d.sum()) == 48


def test_resume_after_interruption_matches_an_uninterrupted_run(easy_target, examples, tmp_path):
    straight = train_head(
        easy_target, None, examples, _config(tmp_path / "a", "eagle1", steps=15, checkpoint_every=0)
    )

    config = _config(tmp_path / "b", "eagle1", steps=15, checkpoint_every=5)
    with pytest.raises(KeyboardInterrupt):
        train_head(easy_target, None, examples, config, stops_at_step(10))
    with pytest.raises(ConfigError, match="checkpoints"):  # never silently mixes two runs
        train_head(easy_target, None, examples, config)
    resumed = train_head(
        easy_target,
        None,
        examples,
        _config(tmp_path / "b", "eagle1", steps=15, checkpoint_every=5, resume=True),
    )
    assert resumed.resumed_from == 10 and resumed.steps == 15 and len(resumed.losses) == 15
    assert resumed.losses == pytest.approx(straight.losses, rel=1e-5, abs=1e-6)
    for key, value in straight.head.state_dict().items():
        torch.testing.assert_close(resumed.head.state_dict()[key], value, rtol=1e-5, atol=1e-6)
    # a finished run can be extended: it continues from its last checkpoint
    longer = train_head(
        easy_target,
        None,
        examples,
        _config(tmp_path / "b", "eagle1", steps=18, checkpoint_every=5, resume=True),
    )
    assert longer.resumed_from == 15 and longer.steps == 18 and len(longer.losses) == 18


def test_training_time_test_unrolls_what_the_drafter_runs():
    """TTT step j at position p == the depth-(j+1) chain draft after committing p-j+1 entries."""
    torch.manual_seed(0)
    target = tiny_target(vocab_size=64, num_layers=8)
    head = tiny_head("eagle3", target)
    features = torch.randn(1, 12, 3 * target.config.hidden_size)
    tokens = torch.randint(0, 64, (1, 12))
    hidden, tokens_in = head.project(features[:, :-1]), tokens[:, 1:]
    outputs = ttt_unroll(head, hidden, tokens_in, steps=4)
    for committed in (1, 4, 6):
        cache = DynamicCache()
        positions = torch.arange(committed)[None]
        bias = causal_bias(committed, committed, torch.float32, torch.device("cpu"))
        out = head(hidden[:, :committed], tokens_in[:, :committed], positions, bias, cache)
        chain = out[:, -1:]
        for depth in range(1, 4):
            p = committed - 1 + depth  # the engine's position id of a depth-`depth` node
            bias = torch.zeros(1, 1, 1, committed + depth)  # prefix + ancestors + itself
            chain = head(chain, tokens_in[:, p : p + 1], torch.tensor([[p]]), bias, cache)
            torch.testing.assert_close(chain[:, 0], outputs[depth][:, p], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("kind", "extra"), [("eagle1", {}), ("eagle3", {"ttt_steps": 4})])
def test_trained_head_speeds_up_the_engine(easy_target, tmp_path, kind, extra):
    """A head trained on the target's own greedy outputs reaches tau well above 1 (about 4.5-5
    of at most 6 with the default depth-5 tree)."""
    examples = _greedy_examples(easy_target, count=24, new_tokens=30, seed=1)
    prompts = [e.input_ids[:PROMPT_LEN] for e in _greedy_examples(easy_target, 3, 1, seed=2)]
    evaluate = train_cli.make_tau_evaluator(
        easy_target, None, prompts, GenerationConfig(max_new_tokens=32)
    )
    config = _config(tmp_path, kind, steps=60, checkpoint_every=0, **extra)
    result = train_head(easy_target, None, examples, config, evaluate=evaluate)
    assert result.tau is not None and result.tau > 1.5, result.tau


def test_cli_trains_regenerates_and_reports_tau(tmp_path, capsys, monkeypatch):
    tokenizer = tiny_tokenizer(tmp_path / "target")
    tiny_target(vocab_size=len(tokenizer), num_layers=8).save_pretrained(tmp_path / "target")
    rows = [
        {
            "conversations": [
                {"from": "human", "value": f"hello {i}"},
                {"from": "gpt", "value": "the fox"},
            ]
        }
        for i in range(6)
    ]
    (tmp_path / "data.json").write_text(json.dumps(rows))
    parser = argparse.ArgumentParser()
    train_cli.add_arguments(parser)
    args = parser.parse_args(
        [
            "--target",
            str(tmp_path / "target"),
            "--data",
            str(tmp_path / "data.json"),
            "--kind",
            "eagle3",
            "--out",
            str(tmp_path / "head"),
            "--steps",
            "3",
            "--batch-size",
            "2",
            "--regenerate",
            "--regen-max-new-tokens",
            "6",
            "--draft-vocab-size",
            "64",
            "--ttt-steps",
            "2",
            "--eval-prompts",
            "1",
            "--eval-max-new-tokens",
            "6",
            "--device",
            "cpu",
            "--checkpoint-every",
            "3",
        ]
    )
    assert train_cli.run(args) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("trained eagle3 head: 3 steps") and "1 held-out prompts" in line
    assert load_head(tmp_path / "head").config.draft_vocab_size == 64
    # --resume continues from checkpoint-3 and reuses the regenerated replies
    monkeypatch.setattr(train_cli, "regenerate_replies", pytest.fail)
    args.resume, args.steps = True, 4
    assert train_cli.run(args) == 0
    assert capsys.readouterr().out.startswith("trained eagle3 head: 4 steps")
    args.target = str(tmp_path / "missing")
    assert train_cli.run(args) == train_cli.EXIT_ERROR


def test_large_features_train_through_scaled_fc_columns_and_save_plain(easy_target) -> None:
    """Targets with large residual streams: fc is trained on features divided by their
    per-channel size, yet saved as an ordinary fc that gives the same outputs on raw features."""
    from models.training.fc_scaling import (
        feature_scale,
        load_plain_state,
        plain_head,
        scale_fc_inputs,
    )

    head = tiny_head("eagle3", easy_target)
    features = torch.randn(2, 9, head.fc.in_features) * torch.linspace(
        0.5, 400, head.fc.in_features
    )
    mask = torch.ones(2, 9, dtype=torch.bool)
    scale = feature_scale(features, mask)
    assert scale.min() >= 1.0 and scale[-1] > 100
    raw_init = head.fc(features).pow(2).mean().sqrt()
    scale_fc_inputs(head, scale)
    scaled_init = head.fc(features).pow(2).mean().sqrt()
    assert scaled_init < raw_init / 20  # the head starts on features of the usual size
    plain = plain_head(head)
    assert not hasattr(plain.fc, "parametrizations")
    torch.testing.assert_close(plain.fc(features), head.fc(features))
    again = tiny_head("eagle3", easy_target, seed=9)
    scale_fc_inputs(again, scale)
    load_plain_state(again, plain.state_dict())
    torch.testing.assert_close(again.fc(features), head.fc(features))
