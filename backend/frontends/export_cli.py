"""``python launch.py export-head``: rewrite a head folder in the layout every known loader
(the reference EAGLE code, SpecForge, vLLM, SGLang, EagleChat) reads the same way.

    python launch.py export-head --head heads/mine --target ./my-model --out heads/mine-vllm \\
        [--fold-fc-bias] [--with-embedding] [--dtype bfloat16]
    python launch.py export-head --pair demo --out heads/demo-eagle3   # the pair's head and target

The weights stay the same tensors (cast only with --dtype); config.json is rewritten by
``HeadConfig.to_dict``. With --target, an EAGLE-3 head that names no feature layers gets the
default ones for that target. ``--fold-fc-bias`` removes an EAGLE-1/2 head's fc bias exactly by
shifting a head-owned copy of the target's embedding (vLLM's EAGLE-1 model has no fc bias).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from backend.errors import ConfigError, EagleChatError
from backend.frontends.flags import add_flags
from backend.frontends.pairs import chosen_pair, local_files
from backend.services.dtypes import DTYPES
from models.checkpoints import load_head, save_head
from models.heads.config import HeadKind, default_eagle3_layer_ids
from models.heads.fc_bias_fold import fold_fc_bias
from models.target_embedding import read_target_embedding

EXIT_ERROR = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, "pair")
    parser.add_argument(
        "--head", help="head folder (config.json + weights); default: the --pair's head"
    )
    parser.add_argument("--out", required=True, help="output folder (may equal --head)")
    parser.add_argument("--target", default=None, help="local target folder the head drafts for")
    parser.add_argument(
        "--fold-fc-bias",
        action="store_true",
        help="EAGLE-1/2: fold the fc bias into a head-owned embedding (vLLM)",
    )
    parser.add_argument(
        "--with-embedding", action="store_true", help="save the target's embedding in the head"
    )
    parser.add_argument(
        "--dtype",
        default=None,
        choices=list(DTYPES),
        help="cast the weights (default: keep the head's dtype)",
    )


def export(args: argparse.Namespace) -> Path:
    pair = chosen_pair(args)
    needs_target = args.fold_fc_bias or args.with_embedding
    if needs_target and not (args.target or pair):
        raise ConfigError("--fold-fc-bias and --with-embedding need --target (or --pair)")
    head_dir = args.head or (local_files(pair.head, "head") if pair else None)
    if head_dir is None:
        raise ConfigError("no head to export", hint="give --head DIR or --pair NAME")
    head = load_head(head_dir)
    dtype = DTYPES[args.dtype] if args.dtype else head_file_dtype(Path(head_dir))
    layer_ids = head.config.eagle_aux_hidden_state_layer_ids
    needs_layers = head.kind is HeadKind.EAGLE3 and layer_ids is None
    target = args.target
    if target is None and pair is not None and (needs_target or needs_layers):
        target = local_files(pair.target, "target")  # read only when the export needs it
    if target and needs_layers:
        layers = json.loads((Path(target) / "config.json").read_text())
        num_layers = layers.get("text_config", layers)["num_hidden_layers"]
        head.config.eagle_aux_hidden_state_layer_ids = list(default_eagle3_layer_ids(num_layers))
    embedding = read_target_embedding(target) if needs_target else None
    if args.fold_fc_bias:
        head = fold_fc_bias(head, embedding)
        dtype = DTYPES[args.dtype] if args.dtype else torch.float32  # keep the fold exact
    elif args.with_embedding and getattr(head, "embed_tokens", None) is None:
        head.bind_target(torch.nn.Embedding.from_pretrained(embedding), None)
    with_embedding = args.with_embedding or args.fold_fc_bias
    return save_head(head, args.out, include_embedding=with_embedding, dtype=dtype)


def head_file_dtype(head_dir: Path) -> torch.dtype | None:
    """The floating dtype the head was saved in, so a re-export keeps it (None if mixed)."""
    from safetensors.torch import load_file

    weights = head_dir / "model.safetensors"
    if not weights.is_file():
        return None
    dtypes = {v.dtype for v in load_file(str(weights)).values() if v.is_floating_point()}
    return dtypes.pop() if len(dtypes) == 1 else None


def run(args: argparse.Namespace) -> int:
    try:
        out = export(args)
    except EagleChatError as err:
        print(f"error: {err.message}", file=sys.stderr)
        if err.hint:
            print(f"hint: {err.hint}", file=sys.stderr)
        return EXIT_ERROR
    print(f"exported head -> {out}")
    return 0
