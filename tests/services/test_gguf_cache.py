"""The kept conversion of a GGUF target: found again only for the same file and transformers,
a plain transformers folder that loads to the same model, and never a half-written folder or a
full disk. (The end-to-end load of a real GGUF file is in tests/real_model/test_gemma3.py.)"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from backend.services import gguf_cache
from backend.services.target_source import TargetSource
from backend.services.validate import read_target_config
from tests.factories import tiny_target, tiny_tokenizer


@pytest.fixture
def gguf_file(tmp_path: Path, monkeypatch) -> TargetSource:
    """A stand-in .gguf file: the cache only reads its name, size and modification time."""
    monkeypatch.setenv("EAGLECHAT_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "tiny.Q4_K_M.gguf").write_bytes(b"GGUF" + bytes(60))
    return TargetSource(str(folder), "tiny.Q4_K_M.gguf")


def test_a_kept_conversion_loads_back_as_the_same_model(gguf_file: TargetSource) -> None:
    tokenizer = tiny_tokenizer()
    model = tiny_target("llama", vocab_size=len(tokenizer)).eval()
    assert gguf_cache.converted_source(gguf_file) is None
    folder = gguf_cache.keep_conversion(gguf_file, model, tokenizer)
    found = gguf_cache.converted_source(gguf_file)
    assert found is not None and found.directory == str(folder) and not found.is_gguf
    again = AutoModelForCausalLM.from_pretrained(found.directory, dtype=torch.float32).eval()
    ids = torch.tensor([tokenizer("hello world, the quick fox")["input_ids"]])
    with torch.inference_mode():
        assert torch.equal(again(ids).logits, model(ids).logits)
    reread = AutoTokenizer.from_pretrained(found.directory)
    assert reread("Écoute ça")["input_ids"] == tokenizer("Écoute ça")["input_ids"]
    assert reread.chat_template == tokenizer.chat_template
    # the config read at validation comes from the kept folder too (no GGUF metadata read)
    assert read_target_config(gguf_file.display).num_hidden_layers == model.config.num_hidden_layers


def test_the_gguf_marker_is_not_kept(gguf_file: TargetSource) -> None:
    """transformers marks a model read from GGUF as quantized ("gguf") though its weights are
    plain by then: such a model is kept, and its folder loads as an ordinary model."""
    tokenizer = tiny_tokenizer()
    model = tiny_target("llama", vocab_size=len(tokenizer))
    model.config.quantization_config = {"quant_method": "gguf"}
    assert gguf_cache.worth_keeping(model)
    folder = gguf_cache.keep_conversion(gguf_file, model, tokenizer)
    assert folder is not None and "quantization_config" not in (folder / "config.json").read_text()
    assert model.config.quantization_config == {"quant_method": "gguf"}  # the live one untouched


def test_a_changed_file_is_converted_again(gguf_file: TargetSource) -> None:
    gguf_cache.keep_conversion(gguf_file, tiny_target("llama"), tiny_tokenizer())
    assert gguf_cache.converted_source(gguf_file) is not None
    path = Path(gguf_file.display)
    path.write_bytes(path.read_bytes() + b"more")  # a new download of the same name
    assert gguf_cache.converted_source(gguf_file) is None


def test_only_exact_float32_weights_are_kept(gguf_file: TargetSource) -> None:
    model = tiny_target("llama").to(torch.bfloat16)
    assert not gguf_cache.worth_keeping(model)
    assert gguf_cache.keep_conversion(gguf_file, model, tiny_tokenizer()) is None
    assert gguf_cache.converted_source(gguf_file) is None
    requantized = tiny_target("llama")
    requantized.config.quantization_config = {"quant_method": "bitsandbytes"}
    assert not gguf_cache.worth_keeping(requantized)
    not_gguf = TargetSource(gguf_file.directory, None)
    assert gguf_cache.keep_conversion(not_gguf, tiny_target("llama"), tiny_tokenizer()) is None


def test_a_full_disk_keeps_nothing_and_says_so(
    gguf_file: TargetSource, monkeypatch, caplog
) -> None:
    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("safetensors.torch.save_model", no_space)
    with caplog.at_level(logging.WARNING, logger="backend.services.gguf_cache"):
        assert gguf_cache.keep_conversion(gguf_file, tiny_target("llama"), tiny_tokenizer()) is None
    assert "No space left" in caplog.text and "converts the file again" in caplog.text
    assert gguf_cache.converted_source(gguf_file) is None
    assert not any(gguf_cache.cache_dir().iterdir())  # no half-written folder left behind


def test_too_little_free_space_is_not_filled(gguf_file: TargetSource, monkeypatch, caplog) -> None:
    class Usage:
        free = 10 << 20

    monkeypatch.setattr(gguf_cache.shutil, "disk_usage", lambda path: Usage)
    with caplog.at_level(logging.WARNING, logger="backend.services.gguf_cache"):
        assert gguf_cache.keep_conversion(gguf_file, tiny_target("llama"), tiny_tokenizer()) is None
    assert "free" in caplog.text
    assert not any(gguf_cache.cache_dir().iterdir())


def test_a_folder_without_its_completion_record_is_ignored(gguf_file: TargetSource) -> None:
    folder = gguf_cache.keep_conversion(gguf_file, tiny_target("llama"), tiny_tokenizer())
    (folder / gguf_cache._DONE).unlink()  # as if the process died before the last write
    assert gguf_cache.converted_source(gguf_file) is None
    assert gguf_cache.keep_conversion(gguf_file, tiny_target("llama"), tiny_tokenizer()) == folder
    assert gguf_cache.converted_source(gguf_file) is not None


def test_a_file_gone_after_loading_keeps_nothing_and_fails_nothing(
    gguf_file: TargetSource, caplog
) -> None:
    Path(gguf_file.display).unlink()  # deleted while the model was loading
    with caplog.at_level(logging.WARNING, logger="backend.services.gguf_cache"):
        assert gguf_cache.keep_conversion(gguf_file, tiny_target("llama"), tiny_tokenizer()) is None
    assert "converts the file again" in caplog.text
