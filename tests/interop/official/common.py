"""Shared by the side-venv scripts: read the request, run the target with transformers, and
write the answer. Imports only torch, transformers and safetensors (present in every side venv).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def read_request() -> tuple[dict, dict[str, torch.Tensor]]:
    """argv[1] is a folder holding request.json and inputs.safetensors."""
    folder = Path(sys.argv[1])
    request = json.loads((folder / "request.json").read_text())
    return request, load_file(str(folder / "inputs.safetensors"))


def write_answer(tensors: dict[str, torch.Tensor]) -> None:
    folder = Path(sys.argv[1])
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "answer.safetensors"))


def target_hidden_states(target_dir: str, prompt_ids: torch.Tensor):
    """The target (float32) and transformers' hidden_states for the prompt: index i < L is the
    input of decoder layer i, index L the final normed output."""
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        out = target(prompt_ids[None], output_hidden_states=True)
    return target, out.hidden_states


def head_config(head_dir: str) -> dict:
    return json.loads((Path(head_dir) / "config.json").read_text())


def head_weights(head_dir: str) -> dict[str, torch.Tensor]:
    return {
        k: v.float() if v.is_floating_point() else v
        for k, v in load_file(str(Path(head_dir) / "model.safetensors")).items()
    }
