"""Export of the trained demo target: config, half-precision safetensors, tokenizer,
generation_config and a manifest that records how it was built (data, schedule, versions,
held-out loss of the exported weights, a few greedy replies)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.demo.pretrain import PackedWindows, build_model, evaluate, load_checkpoint
from models.demo.tokenizer import CHAT_FORMAT, load_tokenizer

logger = logging.getLogger(__name__)

SIZE_BUDGET_BYTES = 40e6  # the bundled demo target should stay small
SAMPLE_PROMPTS = ["Hello! Who are you?", "What is 12 + 7?", "Write a short story about a cat."]


@dataclass(frozen=True)
class ExportOptions:
    dtype: str = "bfloat16"
    eval_windows: int = 48  # held-out windows scored with the exported weights
    seq_len: int = 512
    sample: bool = True  # record greedy replies to a few prompts in the manifest


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def export(
    ckpt_path: Path,
    tokenizer_dir: Path,
    out_dir: Path,
    manifest: dict[str, Any],
    val_tokens: np.ndarray | None = None,
    options: ExportOptions = ExportOptions(),
) -> Path:
    """Write config, half-precision safetensors, tokenizer, generation_config and manifest.

    Written to a temporary sibling folder first and then swapped in, so ``out_dir`` is never
    half-written. The exported weights are re-loaded (fp32) to record their held-out loss.
    """
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    ckpt = load_checkpoint(ckpt_path)
    tokenizer = load_tokenizer(tokenizer_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    _save_model(ckpt, tokenizer, options.dtype, tmp)
    tokenizer.save_pretrained(str(tmp))

    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp), dtype=torch.float32)
    reloaded.eval()
    info: dict[str, Any] = dict(manifest)
    info["export"] = {
        "dtype": options.dtype,
        "from_checkpoint_step": ckpt["state"]["step"],
        "parameters": sum(p.numel() for p in reloaded.parameters()),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if val_tokens is not None and len(val_tokens) > options.seq_len + 1:
        val = PackedWindows(val_tokens, options.seq_len, 1, seed=0)
        loss = evaluate(reloaded, val, torch.device("cpu"), options.eval_windows, batch_size=4)
        info["export"]["val_loss_exported_weights"] = loss
        logger.info("exported weights (%s, read back in fp32): val_loss %.4f", options.dtype, loss)
    if options.sample:
        info["export"]["greedy_samples"] = _greedy_samples(reloaded, tokenizer)
    (tmp / "manifest.json").write_text(
        json.dumps(info, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    _swap_in(tmp, out_dir)
    return out_dir


def _save_model(ckpt: dict[str, Any], tokenizer: Any, dtype: str, folder: Path) -> None:
    """The checkpoint's weights in ``dtype`` with a generation config that stops on <|eos|>."""
    from transformers import GenerationConfig, LlamaConfig

    config = LlamaConfig.from_dict(ckpt["model_config"])
    model = build_model(config, seed=0)
    model.load_state_dict(ckpt["model"])
    model.to(getattr(torch, dtype))  # a name the front end checked against the backend's
    model.config.dtype = dtype
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(str(folder))


def _greedy_samples(model: Any, tokenizer: Any) -> list[dict[str, str]]:
    samples = []
    for prompt in SAMPLE_PROMPTS:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}],
            add_generation_prompt=True,
            return_tensors="pt",
            return_dict=True,
        )
        with torch.no_grad():
            out = model.generate(**ids, max_new_tokens=60, do_sample=False)
        reply = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=False)
        samples.append({"prompt": prompt, "greedy_reply": reply})
        logger.info("sample | %s -> %r", prompt, reply)
    return samples


def _swap_in(tmp: Path, out_dir: Path) -> None:
    """Replace ``out_dir`` by the finished ``tmp`` folder, files world-readable."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    for path in out_dir.iterdir():
        path.chmod(0o644)
    size = _dir_bytes(out_dir)
    logger.info("exported %s (%.1f MB)", out_dir, size / 1e6)
    if size > SIZE_BUDGET_BYTES:
        logger.warning("export is %.1f MB, above the 40 MB budget for the bundled demo", size / 1e6)


def build_manifest(summary: dict[str, Any], ckpt: dict[str, Any]) -> dict[str, Any]:
    """What the export's manifest.json records about the data and the training run."""
    import tokenizers
    import transformers

    state = ckpt["state"]
    hist = state.get("history", [])
    return {
        "name": "EagleChat demo target",
        "architecture": "LlamaForCausalLM",
        "built_by": "python launch.py make-demo-target (models/demo/)",
        "chat_format": CHAT_FORMAT,
        "trained_context": ckpt["options"]["seq_len"],
        "shape": ckpt["shape"],
        "training": {
            "options": ckpt["options"],
            "steps": state["step"],
            "tokens_seen": state["tokens_seen"],
            "epochs": round(state["tokens_seen"] / max(1, summary["train_tokens"]), 3),
            "train_seconds": round(state["train_seconds"], 1),
            "finished_schedule": state.get("finished", False),
            "final_train_loss": hist[-1]["loss"] if hist else None,
            "val_loss_history": [
                {"step": h["step"], "val_loss": h["val_loss"]} for h in hist if "val_loss" in h
            ],
            "device": ckpt.get("device"),
            "threads": ckpt.get("threads"),
        },
        "data": summary,
        "versions": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
        },
    }
