"""A head trained here, served by vLLM (CPU build, loopback), accepts drafts at the rate our
engine measures with a chain of the same length on the same prompts.

The bundled demo heads were trained by ``train-head`` (``make-demo``), and one more EAGLE-3 head
is trained here by the ``train-head`` command on the bench prompts; the EAGLE-1 head is
served as ``export-head --fold-fc-bias`` writes it, since vLLM's EAGLE-1 model has no fc bias
(and silently drafts garbage from a head that has one). Both sides decode
greedily in float32 from the same token ids and ignore EOS, so both count drafts the same way
(vLLM counts acceptance before it stops at EOS; our engine after).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from backend.config import GenerationConfig, LoadConfig, TreeConfig
from backend.frontends.export_cli import export
from backend.services.loading import load_pair
from tests.interop.vllm_server import VllmServer, cpu_spec

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "assets" / "demo"
SPECULATIVE_TOKENS = 4
MAX_NEW_TOKENS = 64
NUM_PROMPTS = 4
RELATIVE_TOLERANCE = 0.10
KIND_OF_METHOD = {"eagle3": "eagle3", "eagle": "eagle1"}  # vLLM's method -> our head kind


def chat_prompts(tokenizer, count: int = NUM_PROMPTS) -> list[list[int]]:
    """The first ``count`` bench prompts through the chat template, as token ids."""
    lines = (ROOT / "assets" / "bench_prompts.jsonl").read_text().splitlines()[:count]
    prompts = []
    for line in lines:
        messages = [{"role": "user", "content": json.loads(line)["turns"][0]}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return prompts


def our_chain_acceptance(pair, prompts: list[list[int]]) -> tuple[float, list[list[int]]]:
    """Accepted / drafted tokens of our engine with a fixed chain of SPECULATIVE_TOKENS."""
    chain = TreeConfig(total_tokens=SPECULATIVE_TOKENS + 1, depth=SPECULATIVE_TOKENS, top_k=1)
    config = GenerationConfig(max_new_tokens=MAX_NEW_TOKENS, stop_on_eos=False, tree=chain)
    drafted = accepted = 0
    outputs = []
    for prompt in prompts:
        summary = list(pair.engine.tokens_only().generate(prompt, config))[-1].summary
        drafted += SPECULATIVE_TOKENS * summary.rounds
        accepted += sum(summary.acceptance_lengths) - summary.rounds  # drafts: minus bonuses
        outputs.append(list(summary.token_ids))
    return accepted / drafted, outputs


def train_small_head(tmp_path: Path) -> Path:
    """A quick EAGLE-3 head from ``python launch.py train-head`` on the target's own replies."""
    data = tmp_path / "prompts.jsonl"
    lines = (ROOT / "assets" / "bench_prompts.jsonl").read_text().splitlines()
    data.write_text(
        "".join(json.dumps({"prompt": json.loads(line)["turns"][0]}) + "\n" for line in lines)
    )
    out = tmp_path / "trained-head"
    command = [
        sys.executable,
        str(ROOT / "launch.py"),
        "train-head",
        "--target",
        str(DEMO / "target"),
        "--data",
        str(data),
        "--kind",
        "eagle3",
        "--out",
        str(out),
        "--regenerate",
        "--regen-max-new-tokens",
        "64",
        "--steps",
        "60",
        "--lr",
        "1e-3",
        "--ttt-steps",
        "3",
        "--draft-vocab-size",
        "1024",
        "--eval-prompts",
        "0",
        "--max-length",
        "256",
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def served_head(kind: str, tmp_path: Path) -> Path:
    if kind == "eagle3":
        return DEMO / "head-eagle3"
    if kind == "trained":
        return train_small_head(tmp_path)
    args = argparse.Namespace(
        pair=None,
        head=str(DEMO / "head-eagle1"),
        out=str(tmp_path / "head-eagle1"),
        target=str(DEMO / "target"),
        fold_fc_bias=True,
        with_embedding=False,
        dtype=None,
    )
    return export(args)


@pytest.mark.parametrize(
    ("kind", "method"), [("eagle3", "eagle3"), ("eagle1", "eagle"), ("trained", "eagle3")]
)
def test_vllm_accepts_the_demo_heads_as_our_engine_does(tmp_path, kind, method) -> None:
    head = served_head(kind, tmp_path)
    pair = load_pair(LoadConfig(target=str(DEMO / "target"), head=str(head), dtype="float32"))
    prompts = chat_prompts(pair.tokenizer)
    ours, our_outputs = our_chain_acceptance(pair, prompts)
    spec = cpu_spec(DEMO / "target", head, KIND_OF_METHOD[method], SPECULATIVE_TOKENS)
    server = VllmServer(spec, tmp_path / "vllm.log")
    try:
        server.wait_healthy()
        before = server.spec_counters()
        their_outputs = [server.complete(prompt, MAX_NEW_TOKENS) for prompt in prompts]
        after = server.spec_counters()
    finally:
        server.stop()
    drafted = after["draft"] - before["draft"]
    accepted = after["accepted"] - before["accepted"]
    assert drafted > 0, "vLLM drafted nothing: speculative decoding was not active"
    theirs = accepted / drafted
    same = sum(a == b for a, b in zip(our_outputs, their_outputs, strict=True))
    report = (
        f"acceptance: ours {ours:.3f}, vLLM {theirs:.3f} ({accepted:.0f}/{drafted:.0f}); "
        f"identical outputs {same}/{len(prompts)}"
    )
    print(report)  # shown with pytest -rP
    assert accepted > 0, report
    assert abs(theirs - ours) <= RELATIVE_TOLERANCE * ours, report
