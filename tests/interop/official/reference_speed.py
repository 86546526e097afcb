"""Timed greedy generation with the reference repository's own ``EaModel`` (SafeAILab/EAGLE),
run in the eagle-reference side venv with that checkout on PYTHONPATH: its ``naivegenerate``
(plain decoding through its own KV cache) and its ``eagenerate`` at each requested tree.

Per tree and method it writes the generated ids, the tree verifications and the wall seconds of
each prompt, so the caller can compute tokens per second exactly as for our engine. The model
is loaded once per tree (its tree buffers are sized at load) and warmed up on the first prompt
before anything is timed. Its ``depth`` counts expansions after the first level: the request's
depth is ours and is passed as depth - 1.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from eagle.model.ea_model import EaModel


def load(request: dict, tree: dict) -> EaModel:
    return EaModel.from_pretrained(
        use_eagle3=request["kind"] == "eagle3",
        base_model_path=request["target"],
        ea_model_path=request["head"],
        total_token=tree["total_tokens"],
        depth=tree["depth"] - 1,
        top_k=tree["top_k"],
        torch_dtype=torch.float32,
    ).eval()


def run(model: EaModel, method: str, prompt: list[int], max_new_tokens: int) -> dict:
    generate = model.eagenerate if method == "eagle" else model.naivegenerate
    start = time.perf_counter()
    output, _, last_round = generate(
        torch.tensor([prompt]), temperature=0.0, max_new_tokens=max_new_tokens, log=True
    )
    seconds = time.perf_counter() - start
    ids = output[0, len(prompt) :].tolist()
    return {"ids": ids, "rounds": int(last_round) + 1, "seconds": seconds}


def main() -> None:
    folder = Path(sys.argv[1])
    request = json.loads((folder / "request.json").read_text())
    torch.set_num_threads(request["threads"])
    prompts, budget = request["prompts"], request["max_new_tokens"]
    results: dict[str, list[dict]] = {}
    for index, tree in enumerate(request["trees"]):
        model = load(request, tree)
        methods = ["eagle"] + (["vanilla"] if index == 0 else [])
        for method in methods:
            run(model, method, prompts[0], budget)  # warm-up, untimed
            name = "vanilla" if method == "vanilla" else tree["label"]
            results[name] = [run(model, method, prompt, budget) for prompt in prompts]
        del model
    (folder / "answer.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
