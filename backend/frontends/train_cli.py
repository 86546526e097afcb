"""``python launch.py train-head``: train an EAGLE-1/2 or EAGLE-3 draft head for a local target.

    python launch.py train-head --target ./my-model --data sharegpt.json --kind eagle3 \\
        --out ./my-head --steps 2000 --regenerate --draft-vocab-size 32000
    python launch.py train-head --pair demo --data chats.jsonl --out ./my-head  # its head's kind
    python launch.py train-head --target gemma.gguf --text --data wiki.txt --kind eagle3 \\
        --out ./gemma-head --regenerate --cache-features ./gemma-cache --epochs 4
    # interrupted? add --resume to continue from the newest checkpoint in --out
    python launch.py train-head --target gemma.gguf --eval-head ./gemma-head \\
        --eval-prompt-file prompts.jsonl --eval-prompts 4     # tau of a head, as the bench has it

Loads the target (frozen) and its tokenizer from a local directory or GGUF file, reads the data
(chat: assistant-only loss; ``--text``: plain text for base models, a held-out share of it set
aside and written as bench prompts), optionally has the target write the replies or
continuations itself, trains (models/training/trainer.py) and measures held-out tau through the
real engine on the bench's settings (train_eval.py). The flags are in train_flags.py. Known
failures print ``error:``/``hint:`` and exit with 2.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

from backend.bench.prompts import BenchPrompt, load_prompts, save_prompts
from backend.engine.device import choose_device
from backend.errors import CheckpointError, ConfigError, EagleChatError
from backend.frontends.pairs import chosen_pair, local_files
from backend.frontends.train_eval import (
    encode_bench_prompts,
    eval_generation,
    make_tau_evaluator,
)
from backend.frontends.train_flags import HELD_OUT_NAME, add_arguments
from backend.services import gguf_cache
from backend.services.dtypes import resolve_dtype
from backend.services.target_source import TargetSource, local_source
from models.chat_format import encode_prompt, text_chunks
from models.checkpoints import check_safetensors_folder, load_head
from models.training.checkpointing import checkpoint_dirs
from models.training.continuations import ContinuationOptions, continue_prompts, cut_prompts
from models.training.data import (
    RegenerateOptions,
    TokenizedExample,
    held_out_units,
    load_conversations,
    load_documents,
    prompt_messages,
    regenerate_replies,
    split_held_out,
    tokenize_conversations,
)
from models.training.trainer import TrainConfig, TrainResult, train_head

__all__ = ["add_arguments", "run"]  # launch.py's interface (the flags: train_flags.py)

logger = logging.getLogger(__name__)

T = TypeVar("T")
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130
REGENERATED_NAME = "regenerated.jsonl"  # in --out: the target's replies, reused by --resume
CONTINUATIONS_NAME = "continuations.jsonl"  # in --out: the target's continuations (--text)
CONTINUED_IDS_NAME = "held_out_continued.jsonl"  # in --out: the target's continuations of them
CONTINUED_WHAT = {CONTINUATIONS_NAME: "the training text", CONTINUED_IDS_NAME: "held-out text"}


def run(args: argparse.Namespace) -> int:
    """Train (or only evaluate), print one summary line; one-line errors with a hint and exit
    code 2."""
    try:
        line = _evaluate_only(args) if args.eval_head else summary_line(*_run(args))
    except EagleChatError as err:
        print(f"error: {err.message}", file=sys.stderr)
        if err.hint:
            print(f"hint: {err.hint}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        print("hint: run the same command with --resume to continue", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(line)
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
    for flag in ("out", "data"):
        if not getattr(args, flag):
            raise ConfigError(f"train-head needs --{flag}", hint="or --eval-head DIR to measure")
    target, kind = target_and_kind(args)  # before the device is chosen: a bad flag fails fast
    if checkpoint_dirs(Path(args.out)) and not args.resume:
        raise ConfigError(
            f"{args.out} already holds training checkpoints",
            hint="resume them (--resume) or choose another output directory",
        )
    model, tokenizer = load_target(
        local_source(target, args.gguf_file), args.dtype, choose_device(args.device)
    )
    if args.text:
        examples, prompts = _text_data(model, tokenizer, args)
    else:
        examples, prompts = _chat_data(model, tokenizer, args)
    logger.info("%d training examples, %d held-out prompts", len(examples), len(prompts))
    evaluate = None
    if prompts:
        generation = eval_generation(args.eval_max_new_tokens, args.eval_tree)
        evaluate = make_tau_evaluator(model, tokenizer, prompts, generation)
    config = _train_config(args, kind, examples)
    return train_head(model, tokenizer, examples, config, evaluate=evaluate), len(prompts)


def _train_config(
    args: argparse.Namespace, kind: str, examples: list[TokenizedExample]
) -> TrainConfig:
    about = {
        "data": list(args.data),
        "text": args.text,
        "held_out_share": args.held_out_share if args.text else None,
        "regenerated": _regeneration_about(args) if args.regenerate else None,
        "examples": len(examples),
        "tokens": sum(min(len(e.input_ids), args.max_length) for e in examples),
        "evaluation": {
            "prompts": args.eval_prompt_file or "held-out data",
            "count": args.eval_prompts,
            "max_new_tokens": args.eval_max_new_tokens,
            "tree": args.eval_tree,
        },
    }
    return TrainConfig(
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
        cache_dir=args.cache_features,
        cache_top_k=args.cache_top_k,
        about=about,
    )


def _regeneration_about(args: argparse.Namespace) -> dict:
    return {
        "max_new_tokens": args.regen_max_new_tokens,
        "temperature": args.regen_temperature,
        "sampled_share": args.regen_sampled_share if args.text else None,
        "prompts": args.regen_prompts if args.text else None,
        "prompt_chars": args.regen_prompt_chars if args.text else None,
    }


def _evaluate_only(args: argparse.Namespace) -> str:
    """--eval-head: the head's tau on the evaluation prompts, as a training run measures it."""
    from backend.services.loading import bind_head

    pair = chosen_pair(args)
    target = local_files(pair.target, "target") if pair is not None else args.target
    if not target:
        raise ConfigError("--eval-head needs the target", hint="--target PATH, or --pair NAME")
    device = choose_device(args.device)
    model, tokenizer = load_target(local_source(target, args.gguf_file), args.dtype, device)
    head, _ = bind_head(model, load_head(args.eval_head), resolve_dtype(args.dtype, device))
    if args.eval_prompt_file:
        prompts = _prompt_file_ids(tokenizer, args)
    elif args.data and args.text:
        held_out = held_out_prompts(args.data, args.held_out_share, args.eval_prompt_chars)
        prompts = encode_bench_prompts(tokenizer, held_out[: args.eval_prompts], "plain")
    else:
        raise ConfigError("--eval-head needs --eval-prompt-file, or --text --data FILES")
    generation = eval_generation(args.eval_max_new_tokens, args.eval_tree)
    head.eval()
    with torch.no_grad():
        tau = make_tau_evaluator(model, tokenizer, prompts, generation)(head)
    return (
        f"tau {tau:.2f} on {len(prompts)} prompts (tree {args.eval_tree}, "
        f"{args.eval_max_new_tokens} new tokens, greedy) for {args.eval_head}"
    )


def _prompt_file_ids(tokenizer, args: argparse.Namespace) -> list[list[int]]:
    prompts = load_prompts(args.eval_prompt_file, args.eval_prompts, args.eval_prompt_chars)
    return encode_bench_prompts(tokenizer, prompts, "plain" if args.text else "auto")


# ---- data -------------------------------------------------------------------------------------


def _chat_data(model, tokenizer, args: argparse.Namespace):
    """Chat examples (the target's own replies with --regenerate) and the evaluation prompts:
    the first user turns of held-out conversations, or --eval-prompt-file."""
    conversations = [c for path in args.data for c in load_conversations(path)]
    held = 0 if args.eval_prompt_file else args.eval_prompts
    train_convs, held_out = split_held_out(conversations, held, args.seed)
    if args.regenerate:
        train_convs = _regenerated(model, tokenizer, train_convs, args)
    examples = tokenize_conversations(tokenizer, train_convs, args.max_length)
    if args.eval_prompt_file and args.eval_prompts:
        return examples, _prompt_file_ids(tokenizer, args)
    return examples, [encode_prompt(tokenizer, prompt_messages(c)) for c in held_out]


def _text_data(model, tokenizer, args: argparse.Namespace):
    """Plain-text examples without the held-out share (the target's continuations with
    --regenerate), and the evaluation prompts: the first --eval-prompts held-out passages
    (all of them written to OUT/held_out*.jsonl for the bench), or --eval-prompt-file."""
    share = args.held_out_share
    held_out = held_out_prompts(args.data, share, args.eval_prompt_chars)
    _save_held_out(Path(args.out), held_out)
    if args.held_out_continued:
        _continue_held_out(model, tokenizer, held_out[: args.held_out_continued], args)
    if args.regenerate:
        passages = [
            d[0]["content"]
            for path in args.data
            for d in load_documents(path, args.regen_prompt_chars, share)
        ]
        examples = _continuations(model, tokenizer, passages, args)
    else:
        documents = [
            d for path in args.data for d in load_documents(path, 4 * args.max_length, share)
        ]
        examples = tokenize_conversations(tokenizer, documents, args.max_length)
    if args.eval_prompt_file:
        return examples, _prompt_file_ids(tokenizer, args) if args.eval_prompts else []
    return examples, encode_bench_prompts(tokenizer, held_out[: args.eval_prompts], "plain")


def held_out_prompts(paths: list[str], share: float, chars: int) -> list[BenchPrompt]:
    """The held-out units of the text files cut into passages of at most ``chars`` (as the
    bench cuts a .txt), as bench prompts named ``<file stem>-<n>``. Interleaved, files first and
    then units (every unit's first passage before any second one), so that the first N mix
    them."""
    per_file = []
    for path in paths:
        stem = Path(path).stem
        units = [text_chunks(unit, chars) for unit in held_out_units(path, share)]
        passages = _interleaved(units)
        per_file.append([BenchPrompt(f"{stem}-{i}", stem, text) for i, text in enumerate(passages)])
    return _interleaved(per_file)


def _interleaved(lists: list[list]) -> list:
    return [item for group in itertools.zip_longest(*lists) for item in group if item is not None]


def _save_held_out(out: Path, prompts: list[BenchPrompt]) -> None:
    """OUT/held_out.jsonl (all files) and OUT/held_out-<file stem>.jsonl (one each), for the
    bench's --prompts."""
    out.mkdir(parents=True, exist_ok=True)
    save_prompts(out / HELD_OUT_NAME, prompts)
    for category in dict.fromkeys(p.category for p in prompts):
        one = [p for p in prompts if p.category == category]
        save_prompts(out / HELD_OUT_NAME.replace(".jsonl", f"-{category}.jsonl"), one)


def _continuations(model, tokenizer, passages: list[str], args: argparse.Namespace):
    """The target's continuations of prompts cut from the training text, kept in --out:
    an interrupted run continues them with --resume; a finished file is read back."""
    options = ContinuationOptions(
        max_new_tokens=args.regen_max_new_tokens,
        sampled_share=args.regen_sampled_share,
        temperature=args.regen_temperature,
        batch_size=args.regen_batch_size,
        max_prompts=args.regen_prompts,
        max_length=args.max_length,
        seed=args.seed,
    )
    done = _continued(model, tokenizer, passages, options, args, CONTINUATIONS_NAME)
    special = getattr(tokenizer, "all_special_ids", [])
    return [continuation.example(special) for continuation in done]


def _continue_held_out(model, tokenizer, held_out: list[BenchPrompt], args) -> None:
    """OUT/held_out-continued.jsonl: held-out passages each followed by the target's greedy
    continuation, as bench prompts: text the model wrote itself after a prompt it never
    trained on (the bench then measures the head deep inside the model's own writing)."""
    options = ContinuationOptions(
        max_new_tokens=args.regen_max_new_tokens,
        sampled_share=0.0,
        batch_size=args.regen_batch_size,
        max_length=args.max_length,
        seed=args.seed,
    )
    passages = [p.text for p in held_out]
    done = _continued(model, tokenizer, passages, options, args, CONTINUED_IDS_NAME)
    prompts = [
        BenchPrompt(
            f"{p.question_id}-continued",
            p.category,
            tokenizer.decode(c.prompt_ids + c.new_ids, skip_special_tokens=True),
        )
        for p, c in zip(held_out, done)
    ]
    save_prompts(Path(args.out) / HELD_OUT_NAME.replace(".jsonl", "-continued.jsonl"), prompts)


def _continued(model, tokenizer, passages, options: ContinuationOptions, args, name: str):
    """The target's continuations of ``passages``, kept in OUT/``name``: read back (and an
    unfinished file completed) with --resume, written anew without it."""
    path = Path(args.out) / name
    if path.is_file() and not args.resume:
        path.unlink()
    prompts = cut_prompts(tokenizer, passages, options)
    return _with_bar(
        len(prompts),
        f"the target continues {CONTINUED_WHAT[name]}",
        lambda progress: continue_prompts(model, tokenizer, prompts, options, path, progress),
    )


def _regenerated(model, tokenizer, conversations, args: argparse.Namespace):
    """The target's own replies, cached in ``--out`` so that ``--resume`` does not redo them."""
    cache = Path(args.out) / REGENERATED_NAME
    if args.resume and cache.is_file():
        logger.info("reusing the regenerated replies in %s", cache)
        return load_conversations(cache)
    options = RegenerateOptions(
        args.regen_max_new_tokens, args.regen_temperature, args.max_length, args.seed
    )
    regenerated = _with_bar(
        len(conversations),
        "regenerate replies",
        lambda progress: regenerate_replies(model, tokenizer, conversations, options, progress),
    )
    cache.parent.mkdir(parents=True, exist_ok=True)
    lines = (json.dumps({"messages": c}, ensure_ascii=False) for c in regenerated)
    cache.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return regenerated


def _with_bar(total: int, what: str, work: Callable[[Callable[[int, int], None]], T]) -> T:
    """``work(progress)`` under a progress bar (with its ETA) that ``progress(done, total)``
    moves."""
    from tqdm.auto import tqdm

    with tqdm(total=total, desc=what, unit="seq") as bar:
        return work(lambda done, _total: bar.update(done - bar.n))


def load_target(source: TargetSource, dtype: str, device: torch.device):
    """A local transformers causal LM + tokenizer, frozen, on ``device`` (no remote code). A
    GGUF file is read from the conversion an earlier load kept (gguf_cache.py), when there is
    one: the same weights, without dequantizing them again."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = gguf_cache.converted_source(source) or source
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
