"""Tiny models built in code: random-weight targets of several architectures, random or
hand-made heads, and a small byte-level tokenizer with a chat template. fp32, fixed seeds."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    GemmaConfig,
    LlamaConfig,
    MistralConfig,
    MixtralConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
)

from models.heads.base import DraftHead
from models.heads.config import HeadKind, head_config_for_target
from models.heads.registry import head_class

ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral", "mixtral")

_COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    tie_word_embeddings=False,
)


def target_config(arch: str, vocab_size: int = 256, num_layers: int = 4):
    common = dict(_COMMON, vocab_size=vocab_size, num_hidden_layers=num_layers)
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "qwen2":
        return Qwen2Config(**common)
    if arch == "qwen3":
        return Qwen3Config(**common, head_dim=16)
    if arch == "mistral":
        return MistralConfig(**common, sliding_window=None)
    if arch == "mixtral":
        return MixtralConfig(
            **common, num_local_experts=4, num_experts_per_tok=2, sliding_window=None
        )
    if arch == "gemma":
        return GemmaConfig(**common, head_dim=16)
    raise ValueError(arch)


def tiny_target(arch: str = "llama", vocab_size: int = 256, num_layers: int = 4, seed: int = 0):
    torch.manual_seed(seed)
    config = target_config(arch, vocab_size, num_layers)
    config._attn_implementation = "sdpa"
    return AutoModelForCausalLM.from_config(config).eval()


def tiny_head(
    kind: HeadKind | str, target, draft_vocab_size: int | None = None, seed: int = 1
) -> DraftHead:
    """A random head shaped for ``target`` and bound to it."""
    torch.manual_seed(seed)
    kind = HeadKind(kind)
    config = head_config_for_target(target.config, kind, draft_vocab_size=draft_vocab_size)
    head = head_class(kind)(config).eval()
    if config.has_reduced_vocab:
        chosen = torch.randperm(config.vocab_size)[: config.draft_vocab_size].sort().values
        head.d2t.copy_(chosen - torch.arange(config.draft_vocab_size))
        head.t2d.zero_()
        head.t2d[chosen] = True
    head.bind_target(target.get_input_embeddings(), target.get_output_embeddings())
    return head


def easy_llama_pair(vocab_size: int = 64, num_layers: int = 8, seed: int = 0):
    """A target whose next token is mostly a fixed permutation of the current one, plus an
    EAGLE-1 head built to know that permutation: drafts are often (not always) right, so
    multi-token acceptance, partial acceptance and bonus tokens all happen."""
    target = tiny_target("llama", vocab_size=vocab_size, num_layers=num_layers, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    hidden = target.config.hidden_size
    with torch.no_grad():
        embedding = target.get_input_embeddings().weight
        embedding.copy_(0.08 * torch.randn(vocab_size, hidden, generator=generator))
        for layer in target.model.layers:  # small residual updates: mostly the token itself
            layer.self_attn.o_proj.weight.mul_(0.35)
            layer.mlp.down_proj.weight.mul_(0.35)
        order = torch.randperm(vocab_size, generator=generator)  # one long cycle
        permutation = torch.empty_like(order)
        permutation[order] = order.roll(-1)
        normed = embedding / embedding.norm(dim=-1, keepdim=True)
        target.lm_head.weight.copy_(4.0 * normed[permutation.argsort()])
    head = tiny_head(HeadKind.EAGLE1, target, seed=seed + 1)
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, :hidden] = torch.eye(hidden)  # pass the token embedding through
        head.fc.bias.zero_()
        head.layers[0].self_attn.o_proj.weight.mul_(0.1)
        head.layers[0].mlp.down_proj.weight.mul_(0.1)
    return target, head


CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def tiny_tokenizer(directory: Path | None = None) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (~256 tokens + specials) trained in code, with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = ["<|end|>", "<|user|>", "<|assistant|>", "<|system|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    text = [
        "hello world, the quick brown fox jumps over the lazy dog. " * 3,
        "Écoute ça: 日本語 ok",
    ]
    tokenizer.train_from_iterator(text, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|end|>",
        pad_token="<|end|>",
        additional_special_tokens=specials[1:],
    )
    fast.chat_template = CHAT_TEMPLATE
    if directory is not None:
        fast.save_pretrained(directory)
    return fast
