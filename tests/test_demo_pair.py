"""The bundled demo pair: both heads load strictly, fit the target, and greedy EAGLE output
equals vanilla output in float32."""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.config import GenerationConfig, LoadConfig, TreeConfig
from backend.events import Finished
from backend.services.loading import load_pair
from backend.services.prompting import prompt_ids

DEMO = Path(__file__).resolve().parents[1] / "assets" / "demo"
PROMPTS = (
    "Hello! Who are you?",
    "Write a Python function that adds two numbers.",
    "Tom has 3 apples and buys 4 more. How many apples does he have?",
)


def chat_ids(pair, prompt: str) -> list[int]:
    return prompt_ids(pair.tokenizer, [{"role": "user", "content": prompt}])


def summary(pair, prompt: str, mode: str, stop_on_eos: bool = True):
    config = GenerationConfig(
        mode=mode,
        max_new_tokens=48,
        tree=TreeConfig(total_tokens=12, depth=5, top_k=3),
        stop_on_eos=stop_on_eos,
    )
    events = list(pair.engine.generate(chat_ids(pair, prompt), config))
    assert isinstance(events[-1], Finished)
    return events[-1].summary


@pytest.mark.parametrize("head", ["head-eagle1", "head-eagle3"])
def test_demo_pair_is_lossless_and_accepts_drafts(head: str) -> None:
    if not (DEMO / head / "config.json").is_file():
        pytest.skip("demo pair not built (python launch.py make-demo)")
    pair = load_pair(
        LoadConfig(target=str(DEMO / "target"), head=str(DEMO / head), dtype="float32")
    )
    assert pair.info.head_kind == head.removeprefix("head-")
    taus = []
    for prompt in PROMPTS:
        eagle, vanilla = summary(pair, prompt, "eagle"), summary(pair, prompt, "vanilla")
        assert eagle.token_ids == vanilla.token_ids
        assert eagle.text == vanilla.text and eagle.text.strip()
        taus.append(eagle.tau)
    assert sum(taus) / len(taus) > 1.5  # trained heads: several tokens per target forward
