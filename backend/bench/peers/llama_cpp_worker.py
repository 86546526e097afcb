"""Plain greedy llama.cpp decoding for ``bench --peer llama.cpp``, run by the llama-cpp side
venv's python (scripts/side-venvs.sh llama-cpp); imports nothing of ours.

    python llama_cpp_worker.py MODEL.gguf THREADS CONTEXT

Loads the model once, prints ``{"ready": true}``, then answers one JSON request per line
(``{"ids": [...], "max_new_tokens": N, "eos_ids": [...]}``) with the generated token ids, the
seconds the generation took (prompt included) and the seconds to the first token.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> int:
    from llama_cpp import Llama

    path, threads, context = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    model = Llama(
        model_path=path,
        n_threads=threads,
        n_threads_batch=threads,
        n_ctx=context,
        verbose=False,
    )
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        print(json.dumps(generate(model, request)), flush=True)
    return 0


def generate(model, request: dict) -> dict:
    """Greedy tokens after ``ids``, stopping at an EOS id (kept) or the token budget."""
    eos = set(request["eos_ids"])
    model.reset()  # no prefix of an earlier prompt is reused
    tokens: list[int] = []
    start = time.perf_counter()
    first = None
    for token in model.generate(request["ids"], top_k=1, temp=0.0, repeat_penalty=1.0):
        if first is None:
            first = time.perf_counter() - start
        tokens.append(int(token))
        if token in eos or len(tokens) >= request["max_new_tokens"]:
            break
    seconds = time.perf_counter() - start
    return {"tokens": tokens, "seconds": seconds, "ttft_s": first or seconds}


if __name__ == "__main__":
    sys.exit(main())
