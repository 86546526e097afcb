"""Average acceptance length (tau) of a head in the reference EAGLE code versus our engine, at
the same tree, greedy, on the same chat prompts; exits 1 when they differ by more than 10%.

    bash scripts/side-venvs.sh eagle-reference
    python -m tests.interop.reference_tau --eagle-source PATH/TO/SafeAILab-EAGLE \\
        --target assets/demo/target --head assets/demo/head-eagle3

The reference repository is not on the package registry, so this is a script to run with a
checkout at hand rather than a CI test. The reference code runs on transformers 4: it gets a
copy of the target folder with a transformers-4 tokenizer config and the
``model.safetensors.index.json`` its embedding loader looks for. Both sides count tokens up to
and including EOS (the reference keeps drafting past it) over tree verifications.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from safetensors import safe_open

from backend.config import GenerationConfig, LoadConfig, TreeConfig
from backend.services.loading import load_pair
from tests.interop.side_venv import OFFICIAL, SIDE_VENVS
from tests.interop.test_vllm_served import chat_prompts

TOLERANCE = 0.10


def transformers4_copy(target: Path, destination: Path) -> Path:
    """The target folder as transformers 4 and the reference's embedding loader read it."""
    destination.mkdir()
    for item in target.iterdir():
        (destination / item.name).symlink_to(item.resolve())
    tokenizer_config = json.loads((target / "tokenizer_config.json").read_text())
    if tokenizer_config.get("tokenizer_class") == "TokenizersBackend":  # transformers 5 name
        tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    if isinstance(tokenizer_config.get("extra_special_tokens"), list):
        tokenizer_config["additional_special_tokens"] = tokenizer_config.pop("extra_special_tokens")
    (destination / "tokenizer_config.json").unlink()
    (destination / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    if not (target / "model.safetensors.index.json").exists():
        weight_map = {}
        for path in sorted(target.glob("*.safetensors")):
            with safe_open(str(path), framework="pt") as handle:
                weight_map |= {key: path.name for key in handle.keys()}
        index = {"metadata": {}, "weight_map": weight_map}
        (destination / "model.safetensors.index.json").write_text(json.dumps(index))
    return destination


def up_to_eos(ids: list[int], eos_ids: tuple[int, ...]) -> list[int]:
    for position, token in enumerate(ids):
        if token in eos_ids:
            return ids[: position + 1]
    return ids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eagle-source", required=True, help="checkout of SafeAILab/EAGLE")
    parser.add_argument("--target", default="assets/demo/target")
    parser.add_argument("--head", default="assets/demo/head-eagle3")
    parser.add_argument("--total-tokens", type=int, default=16)
    parser.add_argument("--depth", type=int, default=5, help="our convention: drafted levels")
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=8, help="first N bench prompts")
    args = parser.parse_args(argv)
    python = SIDE_VENVS / "eagle-reference" / "bin" / "python"
    if not python.is_file():
        print("side venv missing: bash scripts/side-venvs.sh eagle-reference", file=sys.stderr)
        return 2
    pair = load_pair(LoadConfig(target=args.target, head=args.head, dtype="float32"))
    prompts = chat_prompts(pair.tokenizer, args.prompts)
    tree = TreeConfig(total_tokens=args.total_tokens, depth=args.depth, top_k=args.top_k)
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, tree=tree)
    engine = pair.engine.tokens_only()
    ours = [list(engine.generate(p, config))[-1].summary for p in prompts]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        target = transformers4_copy(Path(args.target), work / "target")
        request = {
            "target": str(target),
            "head": str(Path(args.head).resolve()),
            "kind": pair.head.kind.value,
            "total_tokens": args.total_tokens,
            "depth": args.depth,
            "top_k": args.top_k,
            "max_new_tokens": args.max_new_tokens,
            "prompts": prompts,
        }
        (work / "request.json").write_text(json.dumps(request))
        env = {
            **os.environ,
            "PYTHONPATH": str(Path(args.eagle_source).resolve()),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
        subprocess.run(
            [str(python), str(OFFICIAL / "reference_generate.py"), str(work)],
            env=env,
            check=True,
            cwd=tmp,
        )
        theirs = json.loads((work / "answer.json").read_text())
    our_tokens = sum(len(s.token_ids) for s in ours)
    our_rounds = sum(s.rounds for s in ours)
    their_tokens = sum(len(up_to_eos(r["ids"], pair.engine.eos_ids)) for r in theirs)
    their_rounds = sum(r["rounds"] for r in theirs)
    for summary, result in zip(ours, theirs, strict=True):
        same = list(summary.token_ids) == up_to_eos(result["ids"], pair.engine.eos_ids)
        print(
            f"ours {len(summary.token_ids)}/{summary.rounds}  reference "
            f"{len(up_to_eos(result['ids'], pair.engine.eos_ids))}/{result['rounds']}  "
            f"identical {same}"
        )
    our_tau, their_tau = our_tokens / our_rounds, their_tokens / their_rounds
    print(
        f"tau: ours {our_tau:.2f}, reference {their_tau:.2f} (tree {args.total_tokens}/"
        f"{args.depth}/{args.top_k}, {len(prompts)} prompts)"
    )
    return 0 if abs(their_tau - our_tau) <= TOLERANCE * our_tau else 1


if __name__ == "__main__":
    sys.exit(main())
