"""Hub service with HF_HUB_OFFLINE=1 over a hand-built cache: no socket may even be opened.

The cache is laid out the way huggingface_hub writes it:
``models--org--name/{blobs/<hash>, refs/main, snapshots/<commit>/<file> -> ../../blobs/<hash>}``.
"""

from __future__ import annotations

import hashlib
import logging
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from huggingface_hub import constants as hf_constants
from huggingface_hub.utils._xet_progress_reporting import XetDownloadProgressReporter

from backend.errors import ConfigError, HubError
from backend.events import Progress
from backend.services import hub, hub_progress

COMMIT = "1234abcd" * 5
REPO = "org/cached-model"
HEAD_FILES = {"config.json": b'{"draft_vocab_size": 32}', "model.safetensors": b"s" * 4096}
TARGET_FILES = {
    "config.json": b'{"model_type": "qwen3"}',
    "tokenizer.json": b'{"model": {}}',
    "tokenizer_config.json": b"{}",
    "model.safetensors": b"w" * 10_000,
    "README.md": b"# cached",
    "training_args.bin": b"not weights",
}


def build_cache(cache: Path, repo_id: str, files: dict[str, bytes], commit: str = COMMIT) -> Path:
    """Write one repo into ``cache`` exactly as huggingface_hub lays it out; returns the snapshot."""
    storage = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = storage / "snapshots" / commit
    (storage / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    (storage / "refs").mkdir(exist_ok=True)
    (storage / "refs" / "main").write_text(commit)
    for name, data in files.items():
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / name).symlink_to(Path("../..") / "blobs" / blob.name)
    return snapshot


@pytest.fixture(autouse=True)
def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Offline mode, a private cache, and a socket that refuses every connection."""
    cache = tmp_path / "hub-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)

    def refuse(sock: socket.socket, address: Any) -> None:
        raise AssertionError(f"offline test opened a connection to {address}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    return cache


def test_allow_patterns_prefer_safetensors() -> None:
    both = ["config.json", "model.safetensors", "pytorch_model.bin", "tokenizer.json"]
    assert hub.select_files("target", both) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    sharded_bin = [
        "config.json",
        "pytorch_model-00001-of-00002.bin",
        "pytorch_model-00002-of-00002.bin",
        "pytorch_model.bin.index.json",
        "training_args.bin",
        "original/consolidated.00.pth",
    ]
    assert hub.select_files("target", sharded_bin) == sorted(sharded_bin[:4])
    assert hub.select_files("head", both) == ["config.json", "model.safetensors"]
    assert hub.select_files("head", ["config.json", "pytorch_model.bin", "README.md"]) == [
        "config.json",
        "pytorch_model.bin",
    ]
    assert "*.bin" not in " ".join(hub.allow_patterns("target", both))
    with pytest.raises(ConfigError):
        hub.allow_patterns("draft", both)  # type: ignore[arg-type]


def test_resolve_local_uses_folders_as_is_and_the_cache_for_ids(
    offline_cache: Path, tmp_path: Path
) -> None:
    snapshot = build_cache(offline_cache, REPO, TARGET_FILES)
    assert hub.resolve_local(REPO) == str(snapshot)
    assert hub.resolve_local(REPO, revision=COMMIT) == str(snapshot)
    folder = tmp_path / "my-model"
    folder.mkdir()
    assert hub.resolve_local(str(folder)) == str(folder.resolve())
    with pytest.raises(ConfigError):
        hub.resolve_local(str(tmp_path / "no" / "such" / "folder"))


def test_resolve_local_of_an_uncached_repo_says_how_to_get_it() -> None:
    with pytest.raises(HubError) as info:
        hub.resolve_local("org/never-downloaded")
    assert info.value.code == "not_cached"
    assert "org/never-downloaded" in info.value.message
    assert "launch.py download org/never-downloaded" in info.value.hint


def test_offline_plan_is_built_from_the_cache(offline_cache: Path) -> None:
    snapshot = build_cache(offline_cache, REPO, TARGET_FILES)
    plan = hub.plan_download(REPO, "target")
    expected = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert [f.filename for f in plan.files] == expected
    assert all(f.cached and f.size == len(TARGET_FILES[f.filename]) for f in plan.files)
    assert plan.from_cache and plan.commit == COMMIT and plan.bytes_to_download == 0
    assert plan.local_path == str(snapshot)


def test_offline_download_of_a_cached_repo_makes_no_request(offline_cache: Path) -> None:
    snapshot = build_cache(offline_cache, "org/head", HEAD_FILES)
    plan = hub.plan_download("org/head", "head")
    events: list[Progress] = []
    path = hub.download(plan, events.append)
    assert path == str(snapshot)
    assert (Path(path) / "model.safetensors").read_bytes() == HEAD_FILES["model.safetensors"]
    by_unit = {event.unit: event for event in events}  # the last event of each unit
    assert by_unit["bytes"].done == by_unit["bytes"].total == plan.total_bytes
    assert by_unit["files"].done == by_unit["files"].total == len(plan.files)


def test_uncached_repo_in_offline_mode_is_a_clear_hub_error() -> None:
    with pytest.raises(HubError) as info:
        hub.plan_download("org/not-here", "target")
    assert info.value.code == "not_cached"
    assert "org/not-here" in info.value.message and "offline" in info.value.message
    assert "HF_HUB_OFFLINE" in info.value.hint


def test_file_missing_from_the_cache_is_reported_offline(offline_cache: Path) -> None:
    snapshot = build_cache(offline_cache, REPO, TARGET_FILES)
    plan = hub.plan_download(REPO, "target")
    (snapshot / "tokenizer.json").unlink()
    with pytest.raises(HubError) as info:
        hub.download(plan, lambda event: None)
    assert info.value.code == "not_cached" and "tokenizer.json" in info.value.message


def test_cached_copy_without_weights_is_incomplete(offline_cache: Path) -> None:
    build_cache(offline_cache, REPO, {"config.json": b"{}", "README.md": b"#"})
    with pytest.raises(HubError) as info:
        hub.plan_download(REPO, "head")
    assert info.value.code == "missing_files" and REPO in info.value.message


def test_offline_flag_read_at_call_time(
    offline_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HF_HUB_OFFLINE set after huggingface_hub was imported still keeps us off the network."""
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    snapshot = build_cache(offline_cache, REPO, TARGET_FILES)
    plan = hub.plan_download(REPO, "target")
    assert plan.from_cache and hub.download(plan, lambda event: None) == str(snapshot)


def test_xet_progress_reaches_the_meter_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Most Hub weights download through Xet, whose reporter drives the same bar class:
    bytes written must be counted once (network bytes are not added on top)."""
    monkeypatch.setattr(hub_progress, "PROGRESS_INTERVAL_S", 0.0)
    events: list[Progress] = []
    meter = hub_progress.DownloadMeter(events.append, hub_progress.DownloadSize(1000, num_files=1))
    meter.start_file("model.safetensors")
    reporter = XetDownloadProgressReporter(
        reconstruction_desc="model.safetensors",
        total=1000,
        log_level=logging.WARNING,
        tqdm_class=hub_progress.bar_class(meter),
    )
    with reporter:
        for written, received in ((300, 500), (1000, 900)):
            report = SimpleNamespace(
                total_bytes=1000,
                total_bytes_completed=written,
                total_transfer_bytes_completed=received,
                total_bytes_completion_rate=1e6,
                total_transfer_bytes_completion_rate=1e6,
            )
            reporter.update_progress(report)
    meter.finish_file("model.safetensors", 1000)
    done = [e.done for e in events if e.unit == "bytes"]
    assert done == [0, 0, 300, 1000, 1000]
    assert [(e.done, e.total) for e in events if e.unit == "files"] == [(0, 1), (1, 1)]


def test_a_gguf_target_is_one_file_of_its_repo(offline_cache: Path) -> None:
    """A GGUF repo holds several quantizations: only the named file is planned and resolved,
    through --gguf-file or the one-string form org/name:file.gguf; a wrong name lists the rest."""
    from backend.services.planning import fetch

    files = {"model-Q4_K_M.gguf": b"q" * 3000, "model-Q8_0.gguf": b"e" * 6000, "README.md": b"#"}
    snapshot = build_cache(offline_cache, "org/model-gguf", files)
    plan = hub.plan_download("org/model-gguf", "target", gguf_file="model-Q4_K_M.gguf")
    assert [f.filename for f in plan.files] == ["model-Q4_K_M.gguf"]
    assert plan.total_bytes == 3000 and plan.bytes_to_download == 0
    steps = fetch("org/model-gguf:model-Q8_0.gguf", "target", None)
    with pytest.raises(StopIteration) as done:
        next(steps)
    assert done.value.value == str(snapshot / "model-Q8_0.gguf")
    with pytest.raises(HubError, match="no file model-F16.gguf") as err:
        hub.plan_download("org/model-gguf", "target", gguf_file="model-F16.gguf")
    assert "model-Q4_K_M.gguf" in err.value.hint and "model-Q8_0.gguf" in err.value.hint
