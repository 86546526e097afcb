"""Random-weight target/head pairs of real model shapes, for measuring per-round overhead where no
trained pair of that size is at hand (``bench --synthetic 8b`` on a GPU machine).

Drafts of a random head are useless, so the speedup itself means nothing here; what the run
measures is the cost side: verification of 1..60 tokens and one head step relative to one
plain decoding step, and (with a fixed tree) the time a round spends drafting, verifying and
in bookkeeping. The demo pair's tokenizer supplies prompts; its ids are a subset of the
synthetic vocabulary.

With ``perfect=True`` (``bench --perfect-drafts``) target and head rank the vocabulary in one
fixed order whatever the input, token 0 first, so every draft is accepted, while every layer
still computes as before. The speedup then measures round costs alone at a fixed acceptance,
e.g. across prompt lengths (``--prompt-tokens``). The order is strict over the first tokens: with
equal logits (all zero, say) top-k trees would pick among ties in an arbitrary order that
argmax does not share, and only chains would see their drafts accepted.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from backend.engine.device import choose_device
from backend.services.dtypes import resolve_dtype
from models.checkpoints import save_head
from models.heads.config import HeadKind, head_config_for_target
from models.heads.registry import head_class

ROOT = Path(__file__).resolve().parents[2]
DEMO_TARGET = ROOT / "assets" / "demo" / "target"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")

# Llama-family shapes: tiny (tests), small (CPU benches, about 100M parameters), Llama-3.2-1B and
# Llama-3.1-8B.
SHAPES: dict[str, dict[str, int]] = {
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=4096,
    ),
    "small": dict(
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        vocab_size=32000,
    ),
    "1b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
    ),
    "8b": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
    ),
}
DRAFT_VOCAB = 32000  # EAGLE-3 heads for Llama 3 draft over 32k of the 128k tokens


def synthetic_config(shape: str):
    from transformers import LlamaConfig

    if shape not in SHAPES:
        raise ValueError(f"unknown synthetic shape {shape!r}; choose from {', '.join(SHAPES)}")
    return LlamaConfig(
        **SHAPES[shape],
        max_position_embeddings=4096,
        rope_theta=500000.0,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )


@torch.no_grad()
def write_synthetic_pair(
    shape: str,
    folder: Path,
    seed: int = 0,
    dtype: torch.dtype | None = None,
    perfect: bool = False,
) -> tuple[Path, Path]:
    """Save a random target (``dtype``; default bfloat16 on GPUs, float32 on CPUs) and a random
    EAGLE-3 head, both always choosing token 0 if ``perfect``; returns (target_dir, head_dir)
    for the normal loader."""
    from transformers import AutoModelForCausalLM

    config = synthetic_config(shape)
    device = choose_device()
    if dtype is None:
        dtype = resolve_dtype("auto", device)
    torch.manual_seed(seed)
    # Built where it runs and directly in its dtype: a float32 copy first would double the peak.
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    if perfect:
        _rank_in_fixed_order(model.get_decoder().norm, model.get_output_embeddings())
        _keep_dimension_zero(model.get_decoder())
    target_dir, head_dir = folder / "target", folder / "head"
    model.save_pretrained(target_dir)
    for name in TOKENIZER_FILES:
        if (DEMO_TARGET / name).is_file():
            shutil.copy(DEMO_TARGET / name, target_dir / name)
    draft_vocab = min(DRAFT_VOCAB, config.vocab_size)
    head_config = head_config_for_target(config, HeadKind.EAGLE3, draft_vocab_size=draft_vocab)
    with _default_dtype(dtype):  # the head too, though it is small
        head = head_class(HeadKind.EAGLE3)(head_config).eval()
    if head_config.has_reduced_vocab:  # the draft vocabulary is the first draft_vocab ids
        head.d2t.zero_()
        head.t2d.zero_()
        head.t2d[:draft_vocab] = True
    if perfect:
        _rank_in_fixed_order(head.norm, head.lm_head)
        head.fc.weight[0].zero_()
        head.fc.weight[0, 0] = 1.0  # the target's dimension 0 (of its first feature layer)
        head.midlayer.self_attn.o_proj.weight[0].zero_()
        head.midlayer.mlp.down_proj.weight[0].zero_()
    save_head(head, head_dir)
    return target_dir, head_dir


STRICT_RANKS = 64  # tokens ranked with distinct logits (even in bfloat16); the rest tie below


def _rank_in_fixed_order(norm: torch.nn.Module, lm_head: torch.nn.Linear) -> None:
    """Logits from dimension 0 of the normed residual alone (kept positive by
    ``_keep_dimension_zero``), times a fixed column: token 0 first and far ahead (a confident
    head: dynamic trees spend their nodes on depth), then 1, 2, ..."""
    norm.weight.zero_()
    norm.weight[0] = 1.0
    column = torch.full((lm_head.out_features,), -1.0)
    ranked = min(STRICT_RANKS, lm_head.out_features)
    column[:ranked] = 1.0 - torch.arange(ranked) / ranked
    column[0] = 2.0
    lm_head.weight.zero_()
    lm_head.weight[:, 0] = column.to(lm_head.weight)


def _keep_dimension_zero(decoder: torch.nn.Module) -> None:
    """Residual dimension 0 is a large constant from the embedding that no layer writes to,
    so the normed residual's dimension 0 is positive at every position."""
    decoder.embed_tokens.weight[:, 0] = 30.0
    for layer in decoder.layers:
        layer.self_attn.o_proj.weight[0].zero_()
        layer.mlp.down_proj.weight[0].zero_()


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)
