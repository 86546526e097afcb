"""``python launch.py train-head``: train an EAGLE-1/2 or EAGLE-3 draft head for a local target.

    python launch.py train-head --target ./my-model --data sharegpt.json --kind eagle3 \\
        --out ./my-head --steps 2000 --regenerate --draft-vocab-size 32000
    python launch.py train-head --pair demo --data chats.jsonl --out ./my-head  # its head's kind
    # interrupted? add --resume to continue from the newest checkpoint in --out

Loads the target (frozen) and its tokenizer from a local directory, reads and tokenises the
chat data (assistant-only loss), optionally regenerates the replies with the target, trains
(models/training/trainer.py) and measures the average acceptance length tau of the head on
held-out prompts through the real engine. The evaluation lives here because it imports the
engine, which models/ must not. Known failures print ``error:``/``hint:`` and exit with 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import torch

from backend.config import GenerationConfig
from backend.engine.device import choose_device
from backend.engine.drafter import EagleDrafter
from backend.engine.engine import Engine
from backend.engine.stopping import StopSpec
from backend.engine.target import TargetRunner
from backend.errors import CheckpointError, ConfigError, EagleChatError
from backend.events import Finished, average_acceptance_length
from backend.frontends.flags import add_flags
from backend.frontends.pairs import chosen_pair, local_files
from backend.services.dtypes import resolve_dtype
from backend.services.target_source import TargetSource, local_source
from models.chat_format import encode_prompt, eos_token_ids
from models.checkpoints import check_safetensors_folder
from models.features import decoder_of
from models.heads.base import DraftHead
from models.heads.config import HeadKind
from models.training.data import (
    RegenerateOptions,
    load_conversations,
    load_documents,
    prompt_messages,
    regenerate_replies,
    split_held_out,
    tokenize_conversation,
    tokenize_conversations,
)
from models.training.trainer import TrainConfig, TrainResult, train_head

logger = logging.getLogger(__name__)

EXIT_ERROR = 2
EXIT_INTERRUPTED = 130
REGENERATED_NAME = "regenerated.jsonl"  # in --out: the target's replies, reused by --resume


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, "pair")
    parser.add_argument("--target", help="local directory of the target model, or its .gguf file")
    add_flags(parser, "gguf-file")
    parser.add_argument(
        "--data",
        required=True,
        nargs="+",
        help="ShareGPT JSON/JSONL, prompt JSONL or .txt (several allowed)",
    )
    parser.add_argument(
        "--text",
        action="store_true",
        help="the data is plain text to continue (base models): every token "
        "is trained, held-out prompts are the first --eval-prompt-tokens of "
        "held-out pieces",
    )
    parser.add_argument("--eval-prompt-tokens", type=int, default=64)
    parser.add_argument("--kind", choices=[k.value for k in HeadKind], help="default: --pair's")
    parser.add_argument("--out", required=True, help="output directory of the head")
    parser.add_argument("--steps", type=int, default=0, help="optimizer steps (0 = --epochs)")
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=2048, help="tokens per sequence")
    parser.add_argument("--warmup-steps", type=int, default=None)
    parser.add_argument(
        "--regenerate",
        action="store_true",
        help="replace the replies by the target's own (recommended)",
    )
    parser.add_argument("--regen-max-new-tokens", type=int, default=256)
    parser.add_argument("--regen-temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument(
        "--draft-vocab-size",
        type=int,
        default=None,
        help="EAGLE-3 reduced draft vocabulary (e.g. 32000)",
    )
    parser.add_argument("--ttt-steps", type=int, default=7, help="EAGLE-3 training-time test")
    parser.add_argument(
        "--draft-readout-only",
        action="store_true",
        help="EAGLE-3: compute the target's logits on the draft vocabulary only "
        "(much faster for large vocabularies)",
    )
    parser.add_argument("--checkpoint-every", type=int, default=500)
    parser.add_argument("--eval-every", type=int, default=0, help="0 = evaluate at the end")
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    parser.add_argument(
        "--eval-prompts",
        type=int,
        default=8,
        help="held-out prompts for the tau evaluation (0 = none)",
    )
    parser.add_argument("--eval-max-new-tokens", type=int, default=128)
    add_flags(parser, "dtype")
    parser.add_argument("--device", default=None, help="cuda:0, cpu, ... (default: best found)")
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    """Train, evaluate, print one summary line; one-line errors with a hint and exit code 2."""
    try:
        result, held_out = _run(args)
    except EagleChatError as err:
        print(f"error: {err.message}", file=sys.stderr)
        if err.hint:
            print(f"hint: {err.hint}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        print("hint: run the same command with --resume to continue", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(summary_line(result, held_out))
    return 0


def summary_line(result: TrainResult, held_out: int) -> str:
    tau = (
        f"tau {result.tau:.2f} on {held_out} held-out prompts" if result.tau else "tau not measured"
    )
    accuracy = result.accuracies[0] if result.accuracies else 0.0
    return (
        f"trained {result.head.kind.value} head: {result.steps} steps, loss "
        f"{result.final_loss:.4f}, depth-1 agreement {accuracy:.2f}, {tau} -> {result.out_dir}"
    )


def target_and_kind(args: argparse.Namespace) -> tuple[str, str]:
    """The target's local path and the head kind to train: as given, or the --pair's."""
    pair = chosen_pair(args)
    if pair is None:
        if not args.target or not args.kind:
            raise ConfigError(
                "name the target and the head kind, or a catalog pair",
                hint="--target PATH --kind eagle3, or --pair demo",
            )
        return args.target, args.kind
    return local_files(pair.target, "target"), args.kind or pair.head_kind


def _run(args: argparse.Namespace) -> tuple[TrainResult, int]:
    target, kind = target_and_kind(args)  # before the device is chosen: a bad flag fails fast
    device = choose_device(args.device)
    model, tokenizer = load_target(local_source(target, args.gguf_file), args.dtype, device)
    conversations = [c for path in args.data for c in _read_data(path, args)]
    train_convs, held_out = split_held_out(conversations, args.eval_prompts, args.seed)
    if args.regenerate:
        train_convs = _regenerated(model, tokenizer, train_convs, args)
    examples = tokenize_conversations(tokenizer, train_convs, args.max_length)
    logger.info("%d training examples, %d held-out prompts", len(examples), len(held_out))
    config = TrainConfig(
        kind=kind,
        out_dir=args.out,
        steps=args.steps,
        epochs=args.epochs,
        lr=args.lr,
        batch_size=args.batch_size,
        warmup_steps=args.warmup_steps,
        draft_vocab_size=args.draft_vocab_size,
        ttt_steps=args.ttt_steps,
        draft_readout_only=args.draft_readout_only,
        max_length=args.max_length,
        checkpoint_every=args.checkpoint_every,
        eval_every=args.eval_every,
        seed=args.seed,
        resume=args.resume,
    )
    if args.text:
        prompts = [
            tokenize_conversation(tokenizer, c, args.eval_prompt_tokens).input_ids for c in held_out
        ]
    else:
        prompts = [encode_prompt(tokenizer, prompt_messages(c)) for c in held_out]
    evaluate = None
    if prompts:
        evaluate = make_tau_evaluator(
            model, tokenizer, prompts, GenerationConfig(max_new_tokens=args.eval_max_new_tokens)
        )
    return train_head(model, tokenizer, examples, config, evaluate=evaluate), len(prompts)


def _read_data(path: str, args: argparse.Namespace) -> list:
    if args.text:
        return load_documents(path, max_chars=4 * args.max_length)
    return load_conversations(path)


def _regenerated(model, tokenizer, conversations, args: argparse.Namespace):
    """The target's own replies, cached in ``--out`` so that ``--resume`` does not redo them."""
    cache = Path(args.out) / REGENERATED_NAME
    if args.resume and cache.is_file():
        logger.info("reusing the regenerated replies in %s", cache)
        return load_conversations(cache)
    from tqdm.auto import tqdm

    options = RegenerateOptions(
        args.regen_max_new_tokens, args.regen_temperature, args.max_length, args.seed
    )
    with tqdm(total=len(conversations), desc="regenerate replies", unit="conv") as bar:
        regenerated = regenerate_replies(
            model,
            tokenizer,
            conversations,
            options,
            progress=lambda done, total: bar.update(done - bar.n),
        )
    cache.parent.mkdir(parents=True, exist_ok=True)
    lines = (json.dumps({"messages": c}, ensure_ascii=False) for c in regenerated)
    cache.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return regenerated


def load_target(source: TargetSource, dtype: str, device: torch.device):
    """A local transformers causal LM + tokenizer, frozen, on ``device`` (no remote code)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = source.directory
    if not Path(path).is_dir():
        raise ConfigError(
            f"target {path} is not a local directory",
            hint="download it first: python launch.py download <repo>",
        )
    torch_dtype = resolve_dtype(dtype, device)
    check_safetensors_folder(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **source.pretrained_kwargs())
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch_dtype, **source.pretrained_kwargs()
        )
    except (OSError, ValueError) as err:
        raise CheckpointError(f"cannot load the target from {source.display}: {err}") from err
    return model.to(device).eval().requires_grad_(False), tokenizer


def make_tau_evaluator(
    model, tokenizer, prompts: Sequence[list[int]], config: GenerationConfig | None = None
) -> Callable[[DraftHead], float]:
    """evaluate(head) -> tau over all held-out prompts (round tokens / rounds, pooled), greedy,
    through the same engine the app uses. The tree is fixed (auto-tuning off): tau then
    measures the head, not the machine's timings, and is reproducible."""
    config = config or GenerationConfig()
    config = replace(config, tree=replace(config.tree, auto=False))
    eos_ids = eos_token_ids(model, tokenizer)
    num_layers = len(decoder_of(model).layers)

    def evaluate(head: DraftHead) -> float:
        tokens = rounds = 0
        for prompt in prompts:
            drafter = EagleDrafter(head, num_layers)
            runner = TargetRunner(model, drafter.feature_indices)
            engine = Engine(runner, drafter, stops=StopSpec(eos_ids=frozenset(eos_ids)))
            events = list(engine.generate(list(prompt), config))
            summary = next(e for e in reversed(events) if isinstance(e, Finished)).summary
            tokens += sum(summary.acceptance_lengths)
            rounds += summary.rounds
        return average_acceptance_length(tokens, rounds)

    return evaluate
