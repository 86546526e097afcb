"""Synthetic pairs for measuring per-round costs at real model shapes (bench --synthetic)."""

from __future__ import annotations

import torch

from backend.bench.synthetic import SHAPES, synthetic_config, write_synthetic_pair
from backend.config import GenerationConfig, LoadConfig, TreeConfig
from backend.events import Finished
from backend.services.loading import load_pair


def test_real_shapes_have_their_parameter_counts() -> None:
    """Llama-3.2-1B is 1.50B parameters untied (1.24B tied), Llama-3.1-8B 8.03B."""
    from transformers import LlamaForCausalLM

    for shape, expected in (("1b", 1.50e9), ("8b", 8.03e9)):
        config = synthetic_config(shape)
        with torch.device("meta"):
            count = LlamaForCausalLM(config).num_parameters()
        assert abs(count - expected) / expected < 0.01, (shape, count)
    assert set(SHAPES) == {"tiny", "small", "1b", "8b"}


def test_tiny_synthetic_pair_loads_and_stays_lossless(tmp_path) -> None:
    target, head = write_synthetic_pair("tiny", tmp_path)
    pair = load_pair(LoadConfig(target=str(target), head=str(head)))
    assert pair.info.head_kind == "eagle3"
    ids = [1, 5, 9, 300, 4000]
    outputs = {}
    for mode in ("vanilla", "eagle"):
        config = GenerationConfig(
            mode=mode, max_new_tokens=12, tree=TreeConfig(total_tokens=8, depth=4, top_k=2)
        )
        events = list(pair.engine.generate(ids, config))
        outputs[mode] = next(e for e in events if isinstance(e, Finished)).summary.token_ids
    assert outputs["eagle"] == outputs["vanilla"] and len(outputs["vanilla"]) >= 1


def test_perfect_drafts_are_all_accepted_and_the_random_ones_are_not(tmp_path) -> None:
    """With --perfect-drafts every round of a chain accepts its whole depth (tau = depth + 1);
    the same shapes with their norms left random accept almost nothing."""
    chain = TreeConfig(total_tokens=5, depth=4, top_k=1)
    config = GenerationConfig(max_new_tokens=21, tree=chain, stop_on_eos=False)
    tau = {}
    for perfect in (True, False):
        target, head = write_synthetic_pair("tiny", tmp_path / str(perfect), perfect=perfect)
        pair = load_pair(LoadConfig(target=str(target), head=str(head)))
        events = list(pair.engine.generate([1, 5, 9, 300, 4000], config))
        summary = next(e for e in events if isinstance(e, Finished)).summary
        tau[perfect] = (len(summary.token_ids) - 1) / summary.rounds
    assert tau[True] == 5.0 and tau[False] < 2.0


def test_perfect_drafts_hold_in_top_k_trees_too(tmp_path) -> None:
    """The fixed ranking is strict and confident: a dynamic top-k tree (which picks among equal
    logits in its own order, not argmax's) puts its nodes on depth and keeps the whole path."""
    tree = TreeConfig(total_tokens=16, depth=5, top_k=4)
    target, head = write_synthetic_pair("tiny", tmp_path, perfect=True)
    pair = load_pair(LoadConfig(target=str(target), head=str(head)))
    config = GenerationConfig(max_new_tokens=25, tree=tree, stop_on_eos=False)
    events = list(pair.engine.generate([1, 5, 9, 300, 4000], config))
    summary = next(e for e in events if isinstance(e, Finished)).summary
    assert summary.rounds == 4 and len(summary.token_ids) == 25  # 1 + 4 rounds of 5 drafts + 1


def test_synthetic_target_is_built_in_its_dtype_without_a_float32_copy(tmp_path) -> None:
    """Every parameter is created in the requested dtype (an 8B float32 intermediate would need
    twice the memory of the bfloat16 model)."""
    created: list[tuple[str, torch.dtype]] = []

    def record(module, name, param):
        created.append((name, param.dtype))

    handle = torch.nn.modules.module.register_module_parameter_registration_hook(record)
    try:
        target, _ = write_synthetic_pair("tiny", tmp_path, dtype=torch.bfloat16)
    finally:
        handle.remove()
    assert len(created) >= SHAPES["tiny"]["num_hidden_layers"] * 9  # 7 linears + 2 norms each
    assert {dtype for _, dtype in created} == {torch.bfloat16}
    pair = load_pair(LoadConfig(target=str(target), dtype="bfloat16"))
    assert pair.engine.runner.dtype == torch.bfloat16
