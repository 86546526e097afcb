"""Hub service against a loopback fake Hub: plans, progress, resume, cancel and error mapping.

The fake implements the part of the Hub HTTP API huggingface_hub 2.4 uses for our calls, as
read in its source and confirmed by the request log below:
- ``GET /api/models/{repo}/revision/{rev}?blobs=True``: model info with siblings and sizes;
- ``HEAD``/``GET /{repo}/resolve/{commit}/{file}``: ETag, X-Repo-Commit, Content-Length and
  Range (206) support; gated repos answer 401 (no token) or 403 with ``X-Error-Code: GatedRepo``.
Nothing here leaves 127.0.0.1: HF_ENDPOINT points at the fake and a socket guard refuses any
other address.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
from huggingface_hub import constants as hf_constants
from huggingface_hub import file_download as hf_file_download

from backend.errors import (
    ConfigError,
    DiskFullError,
    GatedRepoError,
    GenerationCancelled,
    HubError,
    NetworkError,
    RepoNotFoundError,
)
from backend.events import Progress
from backend.frontends import download_cli
from backend.services import hub, hub_progress

COMMIT = "c0ffee" + "0" * 34
TARGET = "org/tiny-target"
HEAD = "org/tiny-head"


@dataclass
class FakeRepo:
    files: dict[str, bytes]
    gated: bool = False
    drop_once: set[str] = field(default_factory=set)  # first GET of these is cut halfway
    oversized: set[str] = field(default_factory=set)  # HEAD announces 10 bytes more than GET

    def etag(self, name: str) -> str:
        if _is_lfs(name):
            return hashlib.sha256(self.files[name]).hexdigest()
        return hashlib.sha1(self.files[name]).hexdigest()


@dataclass
class Seen:
    method: str
    path: str
    range: str | None
    authorized: bool


class FakeHub:
    """A threaded http.server on a random loopback port that logs every request."""

    def __init__(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.requests: list[Seen] = []
        self.connections: set[socket.socket] = set()
        self.missing_status = 404  # the real Hub answers 401 to anonymous requests
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def close(self) -> None:
        """Stop listening and cut kept-alive connections, like a Hub that went away."""
        self._server.shutdown()
        self._server.server_close()
        for connection in self.connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by the client

    def resolves(self, method: str = "GET") -> list[Seen]:
        return [r for r in self.requests if r.method == method and "/resolve/" in r.path]


def _is_lfs(name: str) -> bool:
    return name.endswith((".safetensors", ".bin"))


def _handler_for(hub_: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return None

        def do_HEAD(self) -> None:
            self._route(send_body=False)

        def do_GET(self) -> None:
            self._route(send_body=True)

        def _route(self, send_body: bool) -> None:
            hub_.connections.add(self.connection)
            path = unquote(urlsplit(self.path).path)
            hub_.requests.append(
                Seen(
                    self.command,
                    path,
                    self.headers.get("Range"),
                    self.headers.get("Authorization") is not None,
                )
            )
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"]:
                self._model_info("/".join(parts[2:4]))
            elif len(parts) >= 5 and parts[2] == "resolve":
                self._resolve("/".join(parts[:2]), "/".join(parts[4:]), send_body)
            else:
                self._error(404, "EntryNotFound")

        def _error(self, status: int, code: str) -> None:
            body = json.dumps({"error": code}).encode()
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _model_info(self, repo_id: str) -> None:
            repo = hub_.repos.get(repo_id)
            if repo is None:
                return self._error(hub_.missing_status, "RepoNotFound")
            siblings = []
            for name, data in repo.files.items():
                entry: dict[str, Any] = {
                    "rfilename": name,
                    "size": len(data),
                    "blobId": hashlib.sha1(data).hexdigest(),
                }
                if _is_lfs(name):
                    entry["lfs"] = {
                        "sha256": repo.etag(name),
                        "size": len(data),
                        "pointerSize": 134,
                    }
                siblings.append(entry)
            info = {
                "id": repo_id,
                "sha": COMMIT,
                "private": False,
                "gated": "manual" if repo.gated else False,
                "siblings": siblings,
            }
            body = json.dumps(info).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _resolve(self, repo_id: str, name: str, send_body: bool) -> None:
            repo = hub_.repos.get(repo_id)
            if repo is None:
                return self._error(hub_.missing_status, "RepoNotFound")
            if repo.gated:
                authorized = self.headers.get("Authorization") is not None
                return self._error(403 if authorized else 401, "GatedRepo")
            if name not in repo.files:
                return self._error(404, "EntryNotFound")
            data = repo.files[name]
            start = 0
            range_header = self.headers.get("Range")
            if range_header and send_body:
                start = int(range_header.removeprefix("bytes=").split("-")[0])
            self.send_response(206 if start else 200)
            self.send_header("ETag", f'"{repo.etag(name)}"')
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("Accept-Ranges", "bytes")
            announced = len(data) + (10 if name in repo.oversized and not send_body else 0)
            self.send_header("Content-Length", str(announced - start))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if not send_body:
                return
            if name in repo.drop_once:
                repo.drop_once.discard(name)
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self.wfile.write(data[start:])

    return Handler


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any connection that is not to the loopback fake Hub."""
    real_connect = socket.socket.connect

    def guarded(sock: socket.socket, address: Any) -> Any:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            if address[0] not in ("127.0.0.1", "localhost", "::1"):
                raise OSError(f"test tried to reach {address}")
        return real_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)


@pytest.fixture
def fake_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    server = FakeHub()
    for name, value in {
        "HF_ENDPOINT": server.url,
        "HF_HOME": str(tmp_path / "home"),
        "HF_HUB_CACHE": str(tmp_path / "cache"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_ETAG_TIMEOUT": "3",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    # huggingface_hub reads these at import; a session-wide HF_HUB_OFFLINE=1 must not leak in.
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_constants, "HF_HUB_DOWNLOAD_TIMEOUT", 5)
    monkeypatch.setattr(hf_constants, "HF_HUB_ETAG_TIMEOUT", 3)
    monkeypatch.setattr(hf_constants, "HF_TOKEN_PATH", str(tmp_path / "home" / "token"))
    monkeypatch.setattr(hub_progress, "PROGRESS_INTERVAL_S", 0.0)
    yield server
    server.close()


def _target_files() -> dict[str, bytes]:
    shard = bytes(range(256)) * 1200  # 307 kB, distinct content per shard below
    return {
        "config.json": b'{"model_type": "llama"}',
        "tokenizer.json": b'{"version": "1.0"}',
        "model.safetensors.index.json": b'{"weight_map": {}}',
        "model-00001-of-00002.safetensors": shard,
        "model-00002-of-00002.safetensors": shard[::-1] + b"tail",
        "pytorch_model.bin": b"old pickle weights",
        "README.md": b"# tiny",
        "original/consolidated.safetensors": b"other format",
    }


def _read(path: str, name: str) -> bytes:
    return (Path(path) / name).read_bytes()


def test_plan_lists_needed_files_with_sizes(fake_hub: FakeHub) -> None:
    files = _target_files()
    fake_hub.repos[TARGET] = FakeRepo(files)
    plan = hub.plan_download(TARGET, "target")
    expected = sorted(
        ["config.json", "tokenizer.json", "model.safetensors.index.json"]
        + ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    )
    assert [f.filename for f in plan.files] == expected
    assert {f.filename: f.size for f in plan.files} == {n: len(files[n]) for n in expected}
    assert plan.commit == COMMIT and not plan.from_cache and not plan.gated
    assert plan.cached_bytes == 0 and plan.bytes_to_download == plan.total_bytes
    # A dry run is one API request and downloads nothing.
    assert [r.method for r in fake_hub.requests] == ["GET"]
    assert fake_hub.requests[0].path == f"/api/models/{TARGET}/revision/main"
    assert not Path(plan.local_path).exists()


def test_download_reports_progress_then_reuses_the_cache(
    fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hf_constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)  # several updates/file
    files = _target_files()
    fake_hub.repos[TARGET] = FakeRepo(files)
    plan = hub.plan_download(TARGET, "target")
    events: list[Progress] = []
    path = hub.download(plan, events.append)

    assert path == plan.local_path
    for planned in plan.files:
        assert _read(path, planned.filename) == files[planned.filename]
    byte_events = [e for e in events if e.unit == "bytes"]
    done = [e.done for e in byte_events]
    assert done == sorted(done) and done[0] == 0 and done[-1] == plan.total_bytes
    assert all(e.total == plan.total_bytes and e.stage == "download" for e in byte_events)
    boundaries = {sum(f.size for f in plan.files[:i]) for i in range(len(plan.files) + 1)}
    assert set(done) - boundaries  # byte events inside files, not only at their ends
    file_events = [e for e in events if e.unit == "files"]
    assert [e.done for e in file_events] == list(range(len(plan.files) + 1))
    assert {e.total for e in file_events} == {len(plan.files)}

    fake_hub.requests.clear()
    again = hub.plan_download(TARGET, "target")
    assert again.num_cached == len(again.files) and again.bytes_to_download == 0
    events.clear()
    assert hub.download(again, events.append) == path
    assert fake_hub.resolves("HEAD") == [] and fake_hub.resolves("GET") == []
    last_bytes = [e for e in events if e.unit == "bytes"][-1]
    assert last_bytes.done == last_bytes.total == plan.total_bytes
    assert hub.resolve_local(TARGET) == path  # refs/main now points at the snapshot


def test_dropped_connection_is_resumed_with_a_range_request(
    fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    # huggingface_hub counts (and resumes from) whole chunks only: bytes of a chunk still
    # being buffered when the connection drops are fetched again. Real chunks are 10 MB.
    chunk = 64 * 1024
    monkeypatch.setattr(hf_constants, "DOWNLOAD_CHUNK_SIZE", chunk)
    files = _target_files()
    shard = "model-00002-of-00002.safetensors"
    fake_hub.repos[TARGET] = FakeRepo(files, drop_once={shard})
    plan = hub.plan_download(TARGET, "target")
    events: list[Progress] = []
    path = hub.download(plan, events.append)

    assert _read(path, shard) == files[shard]
    gets = [r for r in fake_hub.resolves("GET") if r.path.endswith(shard)]
    assert len(gets) == 2 and gets[0].range is None
    resumed_at = int(gets[1].range.removeprefix("bytes=").removesuffix("-"))
    assert resumed_at == (len(files[shard]) // 2) // chunk * chunk > 0
    done = [e.done for e in events if e.unit == "bytes"]
    assert done == sorted(done) and done[-1] == plan.total_bytes


def test_cancel_mid_file_then_rerun_completes(
    fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hf_constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)  # several updates/file
    files = _target_files()
    shard = "model-00001-of-00002.safetensors"
    fake_hub.repos[TARGET] = FakeRepo(files)
    plan = hub.plan_download(TARGET, "target")
    cancel = threading.Event()

    def on_progress(event: Progress) -> None:
        if event.unit == "bytes" and event.message.startswith(shard) and event.done > 0:
            cancel.set()

    with pytest.raises(GenerationCancelled):
        hub.download(plan, on_progress, cancel)
    blobs = Path(plan.cache_dir) / "models--org--tiny-target" / "blobs"
    assert not list(blobs.glob("*.incomplete"))  # huggingface_hub 2.4 deletes partial files
    assert not (Path(plan.local_path) / shard).exists()
    finished_before = {p.name for p in Path(plan.local_path).iterdir()}
    assert finished_before and shard not in finished_before

    fake_hub.requests.clear()
    path = hub.download(hub.plan_download(TARGET, "target"), lambda event: None)
    for planned in plan.files:
        assert _read(path, planned.filename) == files[planned.filename]
    fetched = {r.path.rsplit("/", 1)[-1] for r in fake_hub.resolves("GET")}
    assert shard in fetched and not fetched & finished_before  # finished files are reused
    assert all(r.range is None for r in fake_hub.resolves("GET"))  # the cut file restarts at 0


@pytest.mark.parametrize("token", [None, "hf_not_granted"])
def test_gated_repo_needs_an_accepted_licence(fake_hub: FakeHub, token: str | None) -> None:
    fake_hub.repos[TARGET] = FakeRepo(_target_files(), gated=True)
    with pytest.raises(GatedRepoError) as info:
        hub.plan_download(TARGET, "target", token=token)
    assert TARGET in info.value.message
    assert "accept the licence" in info.value.hint and "HF_TOKEN" in info.value.hint
    status = fake_hub.resolves("HEAD")[-1]
    assert status.authorized == (token is not None)


def test_gated_error_during_download_is_typed(fake_hub: FakeHub) -> None:
    repo = FakeRepo(_target_files())
    fake_hub.repos[TARGET] = repo
    plan = hub.plan_download(TARGET, "target")
    repo.gated = True  # e.g. access revoked between the dry run and the download
    with pytest.raises(GatedRepoError):
        hub.download(plan, lambda event: None)


@pytest.mark.parametrize("status", [404, 401])
def test_missing_repo_is_repo_not_found(fake_hub: FakeHub, status: int) -> None:
    fake_hub.missing_status = status
    with pytest.raises(RepoNotFoundError) as info:
        hub.plan_download("org/does-not-exist", "head")
    assert "org/does-not-exist" in info.value.message
    assert "HF_TOKEN" in info.value.hint  # no token given: private repos look missing


def test_malformed_repo_id_is_a_config_error(fake_hub: FakeHub) -> None:
    with pytest.raises(ConfigError, match="not a valid Hub repo id"):
        hub.plan_download("org/two words", "target")
    assert fake_hub.requests == []


def test_unreachable_hub_is_a_network_error(fake_hub: FakeHub) -> None:
    fake_hub.close()
    start = time.monotonic()
    with pytest.raises(NetworkError) as info:
        hub.plan_download(TARGET, "target")
    assert time.monotonic() - start < 10  # no long retry loop
    assert TARGET in info.value.message and "HF_HUB_OFFLINE" in info.value.hint


def test_unreachable_hub_falls_back_to_a_cached_copy(fake_hub: FakeHub) -> None:
    fake_hub.repos[TARGET] = FakeRepo(_target_files())
    path = hub.download(hub.plan_download(TARGET, "target"), lambda event: None)
    fake_hub.close()
    plan = hub.plan_download(TARGET, "target")
    assert plan.from_cache and plan.local_path == path and plan.bytes_to_download == 0


def test_too_small_disk_is_refused_before_downloading(
    fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_hub.repos[TARGET] = FakeRepo(_target_files())
    plan = hub.plan_download(TARGET, "target")
    usage = shutil.disk_usage("/")
    monkeypatch.setattr(
        hub.shutil, "disk_usage", lambda path: usage._replace(free=plan.total_bytes // 2)
    )
    with pytest.raises(DiskFullError) as info:
        hub.download(plan, lambda event: None)
    message = info.value.message
    assert hub.format_bytes(plan.total_bytes) in message
    assert hub.format_bytes(plan.total_bytes // 2) in message and "free" in message
    assert fake_hub.resolves("GET") == [] and fake_hub.resolves("HEAD") == []


def test_disk_filling_up_mid_download_is_disk_full(
    fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_hub.repos[TARGET] = FakeRepo(_target_files())
    plan = hub.plan_download(TARGET, "target")

    def no_space(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(hf_file_download, "http_get", no_space)
    with pytest.raises(DiskFullError) as info:
        hub.download(plan, lambda event: None)
    assert plan.cache_dir in info.value.message


@pytest.mark.parametrize(
    ("code", "expected"), [(errno.EACCES, "cannot write to the Hub cache"), (errno.ENOENT, None)]
)
def test_an_unwritable_cache_is_named_and_other_os_errors_pass_unchanged(
    fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch, code: int, expected: str | None
) -> None:
    fake_hub.repos[TARGET] = FakeRepo(_target_files())
    plan = hub.plan_download(TARGET, "target")

    def failing(*args: Any, **kwargs: Any) -> None:
        raise OSError(code, "refused")

    monkeypatch.setattr(hf_file_download, "http_get", failing)
    with pytest.raises((OSError, HubError)) as info:
        hub.download(plan, lambda event: None)
    if expected is None:  # nothing we can name: the original error, not a guess
        assert isinstance(info.value, OSError) and info.value.errno == code
    else:
        assert isinstance(info.value, HubError) and info.value.code == "cache_not_writable"
        assert expected in info.value.message and plan.cache_dir in info.value.message


def test_truncated_file_is_a_network_error_and_leaves_no_blob(fake_hub: FakeHub) -> None:
    shard = "model-00001-of-00002.safetensors"
    fake_hub.repos[TARGET] = FakeRepo(_target_files(), oversized={shard})
    plan = hub.plan_download(TARGET, "target")
    with pytest.raises(NetworkError) as info:
        hub.download(plan, lambda event: None)
    assert "Consistency check failed" in info.value.message
    assert not (Path(plan.local_path) / shard).exists()
    assert not list((Path(plan.cache_dir) / "models--org--tiny-target" / "blobs").glob("*.inc*"))


def _cli_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    download_cli.add_arguments(parser)
    return parser.parse_args(argv)


def test_cli_downloads_target_and_head(fake_hub: FakeHub, capsys: pytest.CaptureFixture) -> None:
    fake_hub.repos[TARGET] = FakeRepo(_target_files())
    fake_hub.repos[HEAD] = FakeRepo({"config.json": b"{}", "pytorch_model.bin": b"w" * 5000})
    assert download_cli.run(_cli_args(TARGET, "--head", HEAD, "--dry-run")) == 0
    out = capsys.readouterr().out
    assert "model-00001-of-00002.safetensors" in out and "pytorch_model.bin" in out
    assert "to download" in out and fake_hub.resolves("GET") == []

    assert download_cli.run(_cli_args(TARGET, "--head", HEAD)) == 0
    captured = capsys.readouterr()
    assert "100%" in captured.err and "5/5 files" in captured.err
    lines = captured.out.splitlines()
    head_path = next(line for line in lines if line.startswith("head: ")).removeprefix("head: ")
    assert _read(head_path, "pytorch_model.bin") == b"w" * 5000


def test_cli_prints_error_and_hint(fake_hub: FakeHub, capsys: pytest.CaptureFixture) -> None:
    assert download_cli.run(_cli_args("org/does-not-exist")) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("error: ") and "org/does-not-exist" in err[0]
    assert err[1].startswith("hint: ")
