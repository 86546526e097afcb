"""int8 targets through ``LoadConfig``: read tensor by tensor from safetensors into the int8
form, head in float, EAGLE equal to vanilla of the same int8 target, the memory plan, and the
offer in the Models tab."""

from __future__ import annotations

import pytest
import torch

from app.models_tab import quantization_choices
from backend.api import Backend
from backend.config import LoadConfig
from backend.engine import int8_linear
from backend.engine.int8_linear import is_int8
from backend.errors import ConfigError
from backend.events import Loaded, Progress
from tests.services.conftest import SavedPairs
from tests.services.test_loading_bnb import run


def test_int8_target_loads_quantized_and_eagle_equals_vanilla(saved_pairs: SavedPairs) -> None:
    backend = Backend()
    config = LoadConfig(str(saved_pairs.target), str(saved_pairs.head), quantization="int8")
    events = list(backend.load(config))
    assert isinstance(events[-1], Loaded), events[-1]
    assert "quantize" in [e.stage for e in events if isinstance(e, Progress)]
    info = events[-1].info
    assert info.quantization == "int8" and "re-quantized to int8" in info.weights
    model = backend.pair.model
    assert is_int8(model.model.layers[0].self_attn.q_proj) and is_int8(model.lm_head)
    assert model.model.layers[0].mlp.down_proj.weight.dtype == torch.int8
    assert {p.dtype for p in backend.pair.head.parameters()} == {torch.float32}
    eagle, vanilla = run(backend, "eagle"), run(backend, "vanilla")
    assert eagle.token_ids == vanilla.token_ids and eagle.tau > 1.5


def test_int8_memory_is_planned_between_float_and_nothing(saved_pairs: SavedPairs) -> None:
    backend = Backend()
    sizes = {
        q: backend.plan(str(saved_pairs.target), str(saved_pairs.head), quantization=q).memory_bytes
        for q in ("none", "int8")
    }
    assert 0 < sizes["int8"] < sizes["none"]


def test_int8_computes_in_float32_on_one_device() -> None:
    with pytest.raises(ConfigError, match="float32 on one CPU"):
        LoadConfig("target", quantization="int8", dtype="bfloat16")
    with pytest.raises(ConfigError, match="float32 on one CPU"):
        LoadConfig("target", quantization="int8", device_map="auto")
    with pytest.raises(ConfigError, match="none\\|8bit\\|4bit\\|int8"):
        LoadConfig("target", quantization="int4")  # type: ignore[arg-type]


def test_the_models_tab_offers_int8_and_marks_it_where_recommended() -> None:
    on_cpu = dict((value, label) for label, value in quantization_choices("int8"))
    assert set(on_cpu) == {"none", "int8", "8bit", "4bit"}
    assert "recommended" in on_cpu["int8"] and "recommended" not in on_cpu["none"]
    on_gpu = dict((value, label) for label, value in quantization_choices("none"))
    assert not any("recommended" in label for label in on_gpu.values())
    expected = "int8" if int8_linear.available() else "none"  # a CPU that runs fbgemm
    assert Backend().recommended_quantization() == expected


@pytest.mark.parametrize("calibration", [None, [[3, 1, 4, 1, 5, 9], [2, 6, 5]]])
def test_a_tied_checkpoint_stored_under_one_name_loads_tensor_by_tensor(
    tmp_path, calibration
) -> None:
    """safetensors keeps one name for the shared embedding/readout tensor (a kept GGUF
    conversion is saved that way): it still fills the embedding, and the readout shares it.
    With calibration text, the second pass smooths as quantize_model does."""
    from copy import deepcopy

    from safetensors.torch import save_model

    from backend.engine.int8_linear import quantize_model
    from backend.services.int8_loading import load_int8
    from backend.services.target_source import TargetSource
    from tests.factories import tiny_target

    model = tiny_target("llama")
    model.config.tie_word_embeddings = True
    model.lm_head.weight = model.model.embed_tokens.weight
    save_model(model, str(tmp_path / "model.safetensors"))
    expected = deepcopy(model)
    quantize_model(expected, calibration)
    loaded = load_int8(TargetSource(str(tmp_path)), model.config, calibration).model
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    assert torch.equal(loaded.model.embed_tokens.weight, model.model.embed_tokens.weight)
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.inference_mode():
        assert torch.equal(loaded(input_ids=ids).logits, expected(input_ids=ids).logits)


def saved_tiny_target(folder):
    from safetensors.torch import save_model

    from tests.factories import tiny_target

    model = tiny_target("mistral", num_layers=2)
    folder.mkdir()
    save_model(model, str(folder / "model.safetensors"))
    return model


def test_calibration_peaks_are_kept_so_a_later_load_reads_the_files_once(
    tmp_path, monkeypatch
) -> None:
    from backend.services import int8_loading
    from backend.services.target_source import TargetSource

    monkeypatch.setenv("EAGLECHAT_CACHE_DIR", str(tmp_path / "cache"))
    model = saved_tiny_target(tmp_path / "target")
    source, calibration = TargetSource(str(tmp_path / "target")), [[3, 1, 4, 1, 5], [9, 2, 6]]
    reads = []
    read = int8_loading._safetensors_tensors
    monkeypatch.setattr(
        int8_loading, "_safetensors_tensors", lambda *a: reads.append(a) or read(*a)
    )
    first = int8_loading.load_int8(source, model.config, calibration).model
    assert len(reads) == 2  # placed, then the linears again once the peaks are measured
    assert len(list((tmp_path / "cache" / "int8-peaks").glob("*.safetensors"))) == 1

    def no_measuring(*args):
        raise AssertionError("the kept peaks should have been used")

    monkeypatch.setattr(int8_loading, "input_peaks", no_measuring)
    reads.clear()
    second = int8_loading.load_int8(source, model.config, calibration).model
    assert len(reads) == 1
    ids = torch.tensor([[7, 3, 3, 9, 1]])
    with torch.inference_mode():
        assert torch.equal(first(input_ids=ids).logits, second(input_ids=ids).logits)
    kept = int8_loading._peaks_file(source, calibration)
    assert int8_loading._peaks_file(source, [[5, 5, 5]]) != kept  # other text: measured anew


def test_damaged_kept_peaks_are_measured_again(tmp_path, monkeypatch) -> None:
    from backend.services import int8_loading
    from backend.services.target_source import TargetSource

    monkeypatch.setenv("EAGLECHAT_CACHE_DIR", str(tmp_path / "cache"))
    model = saved_tiny_target(tmp_path / "target")
    source, calibration = TargetSource(str(tmp_path / "target")), [[3, 1, 4, 1, 5]]
    expected = int8_loading.load_int8(source, model.config, calibration).model
    (kept,) = (tmp_path / "cache" / "int8-peaks").glob("*.safetensors")
    kept.write_bytes(b"not a safetensors file")
    loaded = int8_loading.load_int8(source, model.config, calibration).model
    ids = torch.tensor([[2, 4, 6]])
    with torch.inference_mode():
        assert torch.equal(expected(input_ids=ids).logits, loaded(input_ids=ids).logits)
    assert int8_loading._read_peaks(kept, loaded) is not None  # written again, whole
