"""Greedy EAGLE generation with the reference repository's own ``EaModel`` (SafeAILab/EAGLE,
``eagle.model.ea_model``), run in the eagle-reference side venv with that checkout on
PYTHONPATH. Writes, per prompt, the generated ids and the number of tree verifications.

Its ``depth`` counts expansions after the first level, so it drafts depth + 1 levels: the
request's ``depth`` is ours and is passed as depth - 1.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from eagle.model.ea_model import EaModel


def main() -> None:
    folder = Path(sys.argv[1])
    request = json.loads((folder / "request.json").read_text())
    model = EaModel.from_pretrained(
        use_eagle3=request["kind"] == "eagle3",
        base_model_path=request["target"],
        ea_model_path=request["head"],
        total_token=request["total_tokens"],
        depth=request["depth"] - 1,
        top_k=request["top_k"],
        torch_dtype=torch.float32,
    ).eval()
    results = []
    for prompt in request["prompts"]:
        output, _, last_round = model.eagenerate(
            torch.tensor([prompt]),
            temperature=0.0,
            max_new_tokens=request["max_new_tokens"],
            log=True,
        )
        results.append({"ids": output[0, len(prompt) :].tolist(), "rounds": int(last_round) + 1})
    (folder / "answer.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
