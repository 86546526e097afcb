"""End-to-end check of the demo-target build at toy size (a few KB of text, 2 layers, seconds),
through the make-demo-target front end."""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from backend.frontends import demo_target_cli as cli
from models.demo.pretrain import load_checkpoint
from models.demo.target import PACKAGE_LOGGER
from models.demo.tokenizer import ASSISTANT, BOS, EOS, load_tokenizer

STORY = (
    "Once upon a time there was a little cat named Tom. Tom liked to play in the sun. "
    "One day Tom saw a big red ball. He ran to the ball and pushed it with his nose. "
    "The ball rolled away and Tom ran after it. Tom was happy and his mom smiled.\n\n"
)


def _write_toy_data(root: Path) -> None:
    (root / "tinystories").mkdir(parents=True)
    (root / "tinystories" / "tiny_stories.txt").write_text(STORY * 30, encoding="utf-8")
    (root / "fastchat").mkdir()
    convs = [
        {
            "id": f"identity_{i}",
            "conversations": [
                {"from": "human", "value": "Who are you?"},
                {
                    "from": "gpt",
                    "value": "I am Vicuna, a language model trained by researchers "
                    "from Large Model Systems Organization (LMSYS).",
                },
                {"from": "human", "value": f"What is {i} plus {i}?"},
                {"from": "gpt", "value": f"{i} plus {i} is {2 * i}."},
            ],
        }
        for i in range(40)
    ]
    (root / "fastchat" / "dummy_conversation.json").write_text(json.dumps(convs), encoding="utf-8")
    (root / "gsm8k").mkdir()
    rows = [
        {
            "question": f"Tom has {i} balls and gets {i + 2} more. How many balls does he have?",
            "answer": f"Tom has {i}+{i + 2} = <<{i}+{i + 2}={2 * i + 2}>>{2 * i + 2} balls.\n"
            f"#### {2 * i + 2}",
        }
        for i in range(30)
    ]
    (root / "gsm8k" / "train.jsonl").write_text(
        "\n".join(json.dumps(r) for r in rows), encoding="utf-8"
    )


def _args(tmp: Path, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(
        [
            "--data-dir",
            str(tmp / "data"),
            "--bench-dir",
            "",
            "--work-dir",
            str(tmp / "work"),
            "--out-dir",
            str(tmp / "out" / "target"),
            "--sources",
            "fastchat_dummy,gsm8k,tinystories",
            "--val-fraction",
            "0.1",
            "--vocab-size",
            "320",
            "--hidden",
            "32",
            "--layers",
            "2",
            "--heads",
            "2",
            "--kv-heads",
            "1",
            "--intermediate",
            "64",
            "--max-positions",
            "128",
            "--seq-len",
            "32",
            "--batch-size",
            "4",
            "--lr",
            "3e-3",
            "--warmup-steps",
            "3",
            "--steps",
            "40",
            "--log-every",
            "5",
            "--eval-windows",
            "8",
            *extra,
        ]
    )


@pytest.fixture
def offline_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Offline Hub, and the process-wide settings that run() changes restored afterwards."""
    for name, value in [
        ("HF_HUB_OFFLINE", "1"),
        ("TRANSFORMERS_OFFLINE", "1"),
        ("RAYON_NUM_THREADS", "1"),
        ("TOKENIZERS_PARALLELISM", "false"),
    ]:
        monkeypatch.setenv(name, value)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_demo_target_pipeline(
    tmp_path: Path, offline_env: None, caplog: pytest.LogCaptureFixture
) -> None:
    _write_toy_data(tmp_path / "data")
    caplog.set_level(logging.INFO, logger=PACKAGE_LOGGER)

    # 1) interrupted run: stops after 15 steps with a checkpoint, exports nothing
    assert cli.run(_args(tmp_path, "--stop-after", "15")) == 0
    ckpt = load_checkpoint(tmp_path / "work" / "ckpt" / "last.pt")
    assert ckpt["state"]["step"] == 15 and not ckpt["state"]["finished"]
    assert ckpt["state"]["epoch"] * 1000 + ckpt["state"]["index"] > 0  # data position saved
    assert not (tmp_path / "out" / "target").exists()

    # tokenizer: round trip and chat template
    tok = load_tokenizer(tmp_path / "work" / "tokenizer")
    text = "Tom has 12 balls, and the EagleChat demo says: héllo!\n  ok"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt.startswith(BOS) and prompt.endswith(ASSISTANT)
    assert prompt.count(EOS) == 4
    ids = tok.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    assert ids[-1] == tok.convert_tokens_to_ids(ASSISTANT)

    # 2) the same command resumes at the saved step and finishes + exports
    caplog.clear()
    assert cli.run(_args(tmp_path)) == 0
    assert any(
        "resuming from" in r.getMessage() and "step 15," in r.getMessage() for r in caplog.records
    )
    out = tmp_path / "out" / "target"
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["training"]["steps"] == 40
    hist = load_checkpoint(tmp_path / "work" / "ckpt" / "last.pt")["state"]["history"]
    assert hist[0]["step"] == 1 and hist[-1]["step"] == 40
    assert hist[-1]["loss"] < hist[0]["loss"] - 1.0, hist  # the loss falls
    assert manifest["data"]["sources"]["fastchat_dummy"]["licence"] == "Apache-2.0"

    # 3) the export loads offline with the Auto classes and stops on eos
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(out))
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.dtype == torch.bfloat16
    tok2 = AutoTokenizer.from_pretrained(str(out))
    assert tok2.eos_token == EOS and model.generation_config.eos_token_id == tok2.eos_token_id
    enc = tok2.apply_chat_template(
        [{"role": "user", "content": "Who are you?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    gen = model.float().generate(**enc, max_new_tokens=8, do_sample=False)
    assert gen.shape[1] > enc["input_ids"].shape[1]
