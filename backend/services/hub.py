"""The one module that talks to the Hugging Face Hub: plan, download, resolve, map errors.

huggingface_hub's exceptions are caught here and re-raised as ``backend.errors`` types, so no
caller ever sees a raw Hub traceback. Typical use (the CLI glue is
``backend/frontends/download_cli.py``):

    plan = plan_download("Qwen/Qwen3-1.7B", "target")  # one API request, writes nothing
    check_disk_space(plan)
    path = download(plan, progress=print)  # file by file into the shared HF cache

Facts about huggingface_hub 2.4 this relies on (read in its source, checked on a fake Hub):
- ``hf_hub_download`` resumes a dropped transfer itself, inside the same call, with a Range
  request from the last whole 10 MB chunk (up to 5 retries, 1 s apart). A failed or cancelled
  call deletes its partial file (``blobs/<etag>.<random>.incomplete``): the next call restarts
  that file from byte 0, while finished files are kept and reused.
- Per-file byte progress arrives only through ``tqdm_class``, on both the HTTP and Xet paths.
- A download pinned to a commit records no ``refs/main``: :func:`download` writes it.
- Its endpoint, offline flag, cache dir and timeouts are constants read at import time; this
  module reads the environment at call time and passes them explicitly.
"""

from __future__ import annotations

import errno
import fnmatch
import logging
import os
import shutil
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

try:  # huggingface_hub 2.x speaks httpx2; 1.x (which transformers 5.17 requires) httpx
    import httpx2
except ImportError:
    import httpx as httpx2
from huggingface_hub import HfApi, constants, get_hf_file_metadata, hf_hub_download, hf_hub_url
from huggingface_hub import errors as hf_errors
from huggingface_hub.file_download import REGEX_COMMIT_HASH, repo_folder_name
from huggingface_hub.hf_api import RepoSibling

from backend.errors import (
    ConfigError,
    DiskFullError,
    EagleChatError,
    GatedRepoError,
    HubError,
    NetworkError,
    RepoNotFoundError,
)
from backend.events import format_bytes
from backend.services.hub_mode import offline_env
from backend.services.hub_progress import (
    DownloadMeter,
    DownloadSize,
    ProgressCallback,
    bar_class,
)

logger = logging.getLogger(__name__)

RepoKind = Literal["target", "head"]

# config, generation defaults and every tokenizer format transformers may need
TARGET_FILES = tuple(
    "config.json generation_config.json tokenizer.json tokenizer_config.json tokenizer.model "
    "special_tokens_map.json added_tokens.json vocab.json merges.txt chat_template.jinja "
    "chat_template.json".split()
)
SAFETENSORS_WEIGHTS = (
    "model.safetensors",
    "model.safetensors.index.json",
    "model-*-of-*.safetensors",
)
BIN_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*-of-*.bin")
_OFFLINE_HINT = (
    "to download, restart without --offline or HF_HUB_OFFLINE=1, with the Hub reachable; "
    "or pass a local folder instead of a repo id"
)


@dataclass(frozen=True, slots=True)
class PlannedFile:
    filename: str  # path inside the repo
    size: int  # bytes
    cached: bool  # already in the local cache: no transfer needed


@dataclass(frozen=True, slots=True)
class DownloadPlan:
    """What a download of one repo would fetch, and how much of it is already cached."""

    repo_id: str
    kind: RepoKind
    revision: str  # as asked: branch, tag or commit
    commit: str  # the commit it resolved to; downloads are pinned to it
    files: tuple[PlannedFile, ...]
    cache_dir: str
    from_cache: bool = False  # built without the Hub (offline mode or Hub unreachable)
    gated: bool = False  # the repo needs an accepted licence

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def cached_bytes(self) -> int:
        return sum(f.size for f in self.files if f.cached)

    @property
    def bytes_to_download(self) -> int:
        return self.total_bytes - self.cached_bytes

    @property
    def num_cached(self) -> int:
        return sum(f.cached for f in self.files)

    @property
    def local_path(self) -> str:
        """The snapshot folder the files live in once downloaded (what loaders open)."""
        return str(_storage(self.cache_dir, self.repo_id) / "snapshots" / self.commit)


@dataclass(frozen=True, slots=True)
class _Settings:
    endpoint: str | None
    cache_dir: str
    offline: bool
    timeout_s: float


def allow_patterns(
    kind: RepoKind, repo_files: Iterable[str], gguf_file: str | None = None
) -> list[str]:
    """The files a loader needs: weights as safetensors, ``*.bin`` only when none exist; for a
    GGUF target only its one file (it carries the config and the tokenizer)."""
    files = list(repo_files)
    if gguf_file is not None:
        return [gguf_file]
    if kind == "target":
        has_safetensors = any(_matches(f, SAFETENSORS_WEIGHTS) for f in files)
        return [*TARGET_FILES, *(SAFETENSORS_WEIGHTS if has_safetensors else BIN_WEIGHTS)]
    _check_kind(kind)
    weights = "model.safetensors" if "model.safetensors" in files else "pytorch_model.bin"
    return ["config.json", weights]


def select_files(
    kind: RepoKind, repo_files: Iterable[str], gguf_file: str | None = None
) -> list[str]:
    """Top-level repo files matching :func:`allow_patterns` (subfolders such as ``original/``
    hold other formats and are skipped)."""
    files = [f for f in repo_files if "/" not in f or f == gguf_file]
    patterns = allow_patterns(kind, files, gguf_file)
    return sorted(f for f in files if _matches(f, patterns))


def plan_download(
    repo_id: str,
    kind: RepoKind,
    revision: str | None = None,
    token: str | None = None,
    gguf_file: str | None = None,
) -> DownloadPlan:
    """Dry run: the files, their sizes and what is cached, from one Hub API request.

    In offline mode, or when the Hub is unreachable but the repo is cached, the plan is built
    from the cache alone (``from_cache``). Gated repos are checked for access here, so a
    missing licence is reported before anything is downloaded.
    """
    _check_kind(kind)
    settings = _settings()
    revision = revision or constants.DEFAULT_REVISION
    if settings.offline:
        return _plan_from_cache(repo_id, kind, revision, settings, "offline mode is on", gguf_file)
    try:
        with _hub_errors(repo_id, token, settings):
            api = HfApi(endpoint=settings.endpoint, token=token)
            info = api.model_info(
                repo_id, revision=revision, files_metadata=True, timeout=settings.timeout_s
            )
    except NetworkError:
        if _cached_snapshot(repo_id, revision, settings.cache_dir) is None:
            raise
        logger.warning("the Hub is unreachable; planning %s from the local cache", repo_id)
        return _plan_from_cache(
            repo_id, kind, revision, settings, "the Hub is unreachable", gguf_file
        )

    commit = info.sha or revision
    siblings = {s.rfilename: s for s in info.siblings or ()}
    storage = _storage(settings.cache_dir, repo_id)
    names = select_files(kind, siblings, gguf_file)
    files = tuple(_planned_file(siblings[name], storage, commit) for name in names)
    plan = DownloadPlan(
        repo_id, kind, revision, commit, files, settings.cache_dir, gated=bool(info.gated)
    )
    _require_weights(plan, gguf_file, siblings)
    if plan.gated and plan.bytes_to_download:
        _check_access(plan, token, settings)
    logger.info(
        "plan %s@%s: %d files, %s, %s cached",
        repo_id,
        commit[:8],
        len(plan.files),
        format_bytes(plan.total_bytes),
        format_bytes(plan.cached_bytes),
    )
    return plan


def _planned_file(sibling: RepoSibling, storage: Path, commit: str) -> PlannedFile:
    """One file of the Hub's listing, cached when its snapshot link or its blob is on disk."""
    size = sibling.lfs.size if sibling.lfs else sibling.size or 0
    blob = sibling.lfs.sha256 if sibling.lfs else sibling.blob_id
    cached = (storage / "snapshots" / commit / sibling.rfilename).exists() or bool(
        blob and (storage / "blobs" / blob).exists()
    )
    return PlannedFile(sibling.rfilename, size, cached)


def _check_access(plan: DownloadPlan, token: str | None, settings: _Settings) -> None:
    """A gated repo's licence is checked on its first missing file, before anything downloads."""
    first = next(f.filename for f in plan.files if not f.cached)
    url = hf_hub_url(plan.repo_id, first, revision=plan.commit, endpoint=settings.endpoint)
    with _hub_errors(plan.repo_id, token, settings):
        get_hf_file_metadata(url, token=token, timeout=settings.timeout_s)


def check_disk_space(*plans: DownloadPlan) -> None:
    """Raise DiskFullError before a download that cannot fit (partial files share ``blobs/``)."""
    need_by_dir: dict[str, int] = {}
    for plan in plans:
        need_by_dir[plan.cache_dir] = need_by_dir.get(plan.cache_dir, 0) + plan.bytes_to_download
    for cache_dir, need in need_by_dir.items():
        if need <= 0:
            continue
        where = Path(cache_dir)
        while not where.exists() and where != where.parent:
            where = where.parent
        free = shutil.disk_usage(where).free
        if free < need:
            raise DiskFullError(
                f"not enough disk space in {where}: need {format_bytes(need)}, "
                f"{format_bytes(free)} free",
                hint="free some space, or point HF_HUB_CACHE (or HF_HOME) at a larger disk",
            )


def download(
    plan: DownloadPlan,
    progress: ProgressCallback,
    cancel: threading.Event | None = None,
    *,
    token: str | None = None,
) -> str:
    """Fetch the plan's missing files one by one into the HF cache; returns the snapshot folder.

    ``progress`` gets ``unit="bytes"`` events (done/total over the whole plan, cached files
    counted as done from the start, monotonic) and ``unit="files"`` events at the start and
    after each file. Setting ``cancel`` raises GenerationCancelled at the next chunk (plain
    HTTP, 10 MB chunks) or at the latest at the next file (Xet), and keeps finished files.
    """
    settings = _settings()
    snapshot = Path(plan.local_path)
    missing = [f for f in plan.files if not (snapshot / f.filename).exists()]
    if missing and (settings.offline or plan.from_cache):
        names = ", ".join(f.filename for f in missing[:3])
        raise HubError(
            f"{plan.repo_id} is not fully cached ({len(missing)} files missing: {names}) "
            + ("and offline mode is on" if settings.offline else "and the Hub was unreachable"),
            hint=_OFFLINE_HINT,
            code="not_cached",
        )
    if missing:
        check_disk_space(
            DownloadPlan(
                plan.repo_id, plan.kind, plan.revision, plan.commit, tuple(missing), plan.cache_dir
            )
        )
        logger.info("downloading %d files of %s", len(missing), plan.repo_id)
    done = [f for f in plan.files if f not in missing]
    size = DownloadSize(plan.total_bytes, len(plan.files), sum(f.size for f in done), len(done))
    meter = DownloadMeter(progress, size, cancel=cancel, label=plan.repo_id)
    for planned in missing:
        meter.start_file(planned.filename)
        with _hub_errors(plan.repo_id, token, settings):
            hf_hub_download(
                plan.repo_id,
                planned.filename,
                revision=plan.commit,
                cache_dir=plan.cache_dir,
                endpoint=settings.endpoint,
                token=token,
                etag_timeout=settings.timeout_s,
                tqdm_class=bar_class(meter),  # type: ignore[arg-type]
            )
        meter.finish_file(planned.filename, planned.size)
    _write_ref(plan)
    logger.info("%s is complete at %s", plan.repo_id, snapshot)
    return str(snapshot)


def resolve_local(
    repo_or_path: str, revision: str | None = None, gguf_file: str | None = None
) -> str:
    """A local folder as is; otherwise a Hub repo id resolved from the cache (never the network).
    A GGUF target needs only its file in the snapshot, no config.json."""
    path = Path(repo_or_path).expanduser()
    if path.is_dir():
        return str(path.resolve())
    if repo_or_path.startswith((".", "/", "~")) or repo_or_path.count("/") != 1:
        raise ConfigError(f"{repo_or_path!r} is neither a folder nor a Hub repo id (org/name)")
    settings = _settings()
    snapshot = _cached_snapshot(
        repo_or_path, revision or constants.DEFAULT_REVISION, settings.cache_dir
    )
    if snapshot is None:
        raise HubError(
            f"{repo_or_path} is not in the local cache ({settings.cache_dir})",
            hint=f"run: python launch.py download {repo_or_path}",
            code="not_cached",
        )
    needed = gguf_file or "config.json"
    if not (snapshot / needed).is_file():
        raise HubError(
            f"the cached copy of {repo_or_path} is incomplete (no {needed} in {snapshot})",
            hint=f"run: python launch.py download {repo_or_path}",
            code="not_cached",
        )
    return str(snapshot)


def _check_kind(kind: str) -> None:
    if kind not in ("target", "head"):
        raise ConfigError(f"repo kind must be 'target' or 'head', got {kind!r}")


def _settings() -> _Settings:
    env = os.environ
    if env.get("HF_HUB_CACHE"):
        cache_dir = env["HF_HUB_CACHE"]
    elif env.get("HF_HOME"):
        cache_dir = os.path.join(env["HF_HOME"], "hub")
    else:
        cache_dir = constants.HF_HUB_CACHE
    return _Settings(
        endpoint=env.get("HF_ENDPOINT", "").rstrip("/") or None,
        cache_dir=str(Path(cache_dir).expanduser().resolve()),
        offline=offline_env() or constants.is_offline_mode(),
        timeout_s=float(env.get("HF_HUB_ETAG_TIMEOUT") or constants.DEFAULT_ETAG_TIMEOUT),
    )


def _storage(cache_dir: str, repo_id: str) -> Path:
    return Path(cache_dir) / repo_folder_name(repo_id=repo_id, repo_type="model")


def _matches(filename: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(filename, pattern) for pattern in patterns)


def _cached_snapshot(repo_id: str, revision: str, cache_dir: str) -> Path | None:
    storage = _storage(cache_dir, repo_id)
    commit = revision
    if not REGEX_COMMIT_HASH.fullmatch(revision):
        ref = storage / "refs" / revision
        if not ref.is_file():
            return None
        commit = ref.read_text(encoding="utf-8").strip()
    snapshot = storage / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None


def _write_ref(plan: DownloadPlan) -> None:
    """Point ``refs/<revision>`` at the commit once its files are complete.

    Downloads are pinned to the commit, and huggingface_hub only records refs for the revision
    it was given, so without this a cache-only lookup of "main" would not find the snapshot.
    """
    if plan.revision == plan.commit or plan.from_cache:
        return
    ref = _storage(plan.cache_dir, plan.repo_id) / "refs" / plan.revision
    try:
        ref.parent.mkdir(parents=True, exist_ok=True)
        if not ref.is_file() or ref.read_text(encoding="utf-8") != plan.commit:
            tmp = ref.with_name(f"{ref.name}.{os.getpid()}.tmp")
            tmp.write_text(plan.commit, encoding="utf-8")
            os.replace(tmp, ref)
    except OSError as err:
        logger.warning("could not record %s -> %s in the cache: %s", ref, plan.commit[:8], err)


def _plan_from_cache(
    repo_id: str,
    kind: RepoKind,
    revision: str,
    settings: _Settings,
    reason: str,
    gguf_file: str | None = None,
) -> DownloadPlan:
    snapshot = _cached_snapshot(repo_id, revision, settings.cache_dir)
    if snapshot is None:
        raise HubError(
            f"{repo_id} is not in the local cache ({settings.cache_dir}) and {reason}",
            hint=_OFFLINE_HINT if settings.offline else "check your connection and try again",
            code="not_cached",
        )
    present = [p.name for p in snapshot.iterdir() if p.is_file()]
    names = select_files(kind, present, gguf_file)
    files = tuple(PlannedFile(n, (snapshot / n).stat().st_size, True) for n in names)
    plan = DownloadPlan(
        repo_id, kind, revision, snapshot.name, files, settings.cache_dir, from_cache=True
    )
    _require_weights(plan, gguf_file, present)
    return plan


def _require_weights(
    plan: DownloadPlan, gguf_file: str | None = None, repo_files: Iterable[str] = ()
) -> None:
    names = {f.filename for f in plan.files}
    if gguf_file is not None:
        if gguf_file not in names:
            found = sorted(f for f in repo_files if f.lower().endswith(".gguf"))
            raise HubError(
                f"{plan.repo_id} has no file {gguf_file}",
                hint=f"GGUF files there: {', '.join(found)}" if found else "check the file name",
                code="missing_files",
            )
        return
    if "config.json" not in names or not any(
        _matches(name, SAFETENSORS_WEIGHTS + BIN_WEIGHTS) for name in names
    ):
        where = "cached copy of " if plan.from_cache else ""
        raise HubError(
            f"the {where}{plan.repo_id} has no config.json or model weights "
            "(model*.safetensors or pytorch_model*.bin)",
            hint=f"is {plan.repo_id} a transformers {plan.kind} repo?",
            code="missing_files",
        )


@contextmanager
def _hub_errors(repo_id: str, token: str | None, settings: _Settings) -> Iterator[None]:
    """Map huggingface_hub/httpx failures to typed errors: the one place that knows them."""
    try:
        yield
    except EagleChatError:
        raise
    except (
        hf_errors.HFValidationError,
        hf_errors.HfHubHTTPError,
        hf_errors.OfflineModeIsEnabled,
        hf_errors.LocalEntryNotFoundError,
        httpx2.TransportError,
        OSError,
    ) as err:
        typed = _typed_error(err, repo_id, token, settings)
        if typed is None:
            raise
        raise typed from err


def _typed_error(
    err: Exception, repo_id: str, token: str | None, settings: _Settings
) -> EagleChatError | None:
    """Our error for one Hub, network or disk failure; None for an OS error we cannot name."""
    if isinstance(err, hf_errors.HFValidationError):
        return ConfigError(f"{repo_id!r} is not a valid Hub repo id: {err}")
    if isinstance(err, hf_errors.HfHubHTTPError):
        return _http_error(err, repo_id, token, settings.endpoint)
    if isinstance(err, (hf_errors.OfflineModeIsEnabled, hf_errors.LocalEntryNotFoundError)):
        if settings.offline:
            return HubError(
                f"{repo_id} is not in the local cache and offline mode is on",
                hint=_OFFLINE_HINT,
                code="not_cached",
            )
        return NetworkError(f"could not reach the Hub for {repo_id}", hint=_NETWORK_HINT)
    if isinstance(err, httpx2.TransportError):
        return NetworkError(
            f"could not reach the Hub for {repo_id} ({type(err).__name__})", hint=_NETWORK_HINT
        )
    if isinstance(err, OSError):
        return _os_error(err, repo_id, settings.cache_dir)
    return None


def _http_error(
    err: hf_errors.HfHubHTTPError, repo_id: str, token: str | None, endpoint: str | None
) -> EagleChatError:
    """Gated, missing or refused repos, revisions and files, by exception type, then status."""
    page = f"{endpoint or 'https://huggingface.co'}/{repo_id}"
    if isinstance(err, hf_errors.GatedRepoError):
        return GatedRepoError(
            f"{repo_id} is gated: your account has not been granted access",
            hint=f"accept the licence on {page}, then {_LOGIN_HINT} with that account's token",
        )
    if isinstance(err, hf_errors.RevisionNotFoundError):
        return RepoNotFoundError(f"{repo_id} has no such revision", hint="check --revision")
    if isinstance(err, hf_errors.RemoteEntryNotFoundError):
        return RepoNotFoundError(f"a file listed for {repo_id} is missing on the Hub")
    if isinstance(err, hf_errors.RepositoryNotFoundError):
        private = "" if token else f"; if it is private or gated, {_LOGIN_HINT}"
        return RepoNotFoundError(
            f"repository {repo_id} was not found", hint="check the repo id" + private
        )
    status = err.response.status_code if err.response is not None else None
    if status == 401:
        return HubError(f"the Hub rejected your token for {repo_id}", hint=_LOGIN_HINT, code="auth")
    if status == 403:
        return GatedRepoError(
            f"access to {repo_id} was refused (403)",
            hint=f"accept the licence on {page}; make sure your token can read gated repos",
        )
    return NetworkError(f"the Hub answered HTTP {status} for {repo_id}", hint="try again later")


def _os_error(err: OSError, repo_id: str, cache_dir: str) -> EagleChatError | None:
    """A full disk, an unwritable cache, or huggingface_hub's own checks failing a transfer."""
    if err.errno == errno.ENOSPC:
        return DiskFullError(
            f"the disk filled up while downloading {repo_id} into {cache_dir}",
            hint="free some space, or point HF_HUB_CACHE (or HF_HOME) at a larger disk",
        )
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return HubError(
            f"cannot write to the Hub cache {cache_dir}: {err.strerror}",
            hint="point HF_HUB_CACHE (or HF_HOME) at a writable folder",
            code="cache_not_writable",
        )
    if err.errno is None:  # raised by huggingface_hub itself: size mismatch, bad headers
        first_line = str(err).splitlines()[0] if str(err) else type(err).__name__
        return NetworkError(
            f"downloading {repo_id} failed: {first_line}",
            hint="run it again; if it persists, check HF_ENDPOINT and any proxy",
        )
    return None


_LOGIN_HINT = "set HF_TOKEN or run `hf auth login`"
_NETWORK_HINT = (
    "check your connection (or HF_ENDPOINT); to use only models already downloaded, "
    "set HF_HUB_OFFLINE=1"
)
