"""The frozen target's outputs kept on disk, so that it runs once per token however many epochs
read them.

    cache = FeatureCache.open_or_fill(CacheSettings("cache-dir"), target, examples, spec)
    batch = cache.batch([3, 17, 5, 9])   # a TargetBatch, as losses.target_batch gives it

Per token the cache keeps the head's input features (float16, or bfloat16 when a target's
features outgrow float16) and the target's distribution over the head's columns as its ``top_k``
most likely columns: their log-probabilities (float16) and ids (int16, or int32 for a vocabulary
above 32767 columns), plus whether the target's best token is among the columns at all. Read
back, the top entries are renormalised: the loss then trains toward the target's distribution
cut to its ``top_k`` most likely tokens.

Examples are stored in shards of consecutive examples, each a set of memory-mapped arrays
written under a temporary name and renamed when complete, then recorded in ``manifest.json``.
An interrupted fill continues at the first missing shard; the manifest's fingerprint (the
examples, the target, the features and columns asked for, ``top_k``) keeps a cache from being
read for anything else.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from models.errors import ConfigError
from models.features import decoder_of
from models.training.data import TokenizedExample, pad_examples
from models.training.losses import BatchSpec, DraftTargets, TargetBatch, target_batch

logger = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
CACHE_FORMAT = 1
SHARD_TOKENS = 1 << 16  # target tokens per shard (the last one may hold fewer)
FLOAT16_LIMIT = 60000.0  # features beyond this (float16 tops out at 65504) are kept in bfloat16
_ARRAYS = ("features", "logprobs", "columns", "in_vocab")


@dataclass(frozen=True, slots=True)
class CacheSettings:
    directory: str | Path
    top_k: int = 64  # the target's most likely columns kept per token
    batch_size: int = 4  # sequences per target forward while filling


@dataclass(frozen=True, slots=True)
class CacheLayout:
    """What one token's entry holds, and in which types."""

    feature_size: int
    top_k: int
    feature_dtype: str  # "float16" or "bfloat16"
    column_dtype: str  # "int16" or "int32"

    def bytes_per_token(self) -> int:
        columns = np.dtype(self.column_dtype).itemsize
        return 2 * self.feature_size + (2 + columns) * self.top_k + 1

    def shapes(self, tokens: int) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Array name -> (numpy dtype, shape) of a shard of ``tokens`` tokens; bfloat16 is
        stored as its raw 16 bits."""
        stored = "float16" if self.feature_dtype == "float16" else "uint16"
        return {
            "features": (stored, (tokens, self.feature_size)),
            "logprobs": ("float16", (tokens, self.top_k)),
            "columns": (self.column_dtype, (tokens, self.top_k)),
            "in_vocab": ("uint8", (tokens,)),
        }


def shard_plan(lengths: Sequence[int], shard_tokens: int) -> list[range]:
    """Consecutive example ranges holding about ``shard_tokens`` tokens each."""
    shards, start, tokens = [], 0, 0
    for index, length in enumerate(lengths):
        tokens += length
        if tokens >= shard_tokens:
            shards.append(range(start, index + 1))
            start, tokens = index + 1, 0
    if start < len(lengths):
        shards.append(range(start, len(lengths)))
    return shards


def fingerprint(
    target: nn.Module, examples: Sequence[TokenizedExample], spec: BatchSpec, top_k: int
) -> str:
    """A digest of everything the cached values depend on: the examples (as the target sees
    them), the target (its type, shape and a sample of its weights), the feature layers, the
    head's columns, the readout and ``top_k``."""
    digest = hashlib.sha256()
    for example in examples:
        n = min(len(example.input_ids), spec.max_length)
        digest.update(np.asarray(example.input_ids[:n], dtype=np.int64).tobytes())
        digest.update(np.asarray(example.loss_mask[:n], dtype=np.int8).tobytes())
    digest.update(type(target).__name__.encode())  # not its path: a kept conversion moves it
    for module in (target.get_input_embeddings(), decoder_of(target).layers[-1]):
        weight = next(module.parameters()).detach()
        sample = weight.flatten()[:4096].float().cpu().numpy()
        digest.update(sample.tobytes() + str(tuple(weight.shape)).encode())
    columns = spec.columns.cpu().numpy().tobytes() if spec.columns is not None else b"all"
    digest.update(columns + f"|{spec.feature_layers}|{spec.readout_only}|{top_k}".encode())
    digest.update(f"|{spec.max_length}|{CACHE_FORMAT}".encode())
    return digest.hexdigest()


class FeatureCache:
    """A filled cache, read one batch at a time."""

    def __init__(
        self, directory: Path, examples: Sequence[TokenizedExample], spec: BatchSpec
    ) -> None:
        self.directory = Path(directory)
        self.examples, self.spec = examples, spec
        manifest = json.loads((self.directory / MANIFEST_NAME).read_text())
        self.layout = CacheLayout(**manifest["layout"])
        self.kept_mass = float(manifest.get("kept_mass", 1.0))
        self.fill_s = 0.0  # the target's pass that filled missing shards in this process
        lengths = [min(len(e.input_ids), spec.max_length) for e in examples]
        self._where: list[tuple[int, int]] = []  # example -> (shard, first row)
        self._arrays: list[dict[str, np.memmap]] = []
        for number, shard in enumerate(manifest["shards"]):
            first, count = shard["first"], shard["count"]
            offsets = np.cumsum([0] + lengths[first : first + count])
            self._where += [(number, int(offsets[i])) for i in range(count)]
            self._arrays.append(_open_shard(self.directory, number, self.layout, int(offsets[-1])))

    @classmethod
    def open_or_fill(
        cls,
        settings: CacheSettings,
        target: nn.Module,
        examples: Sequence[TokenizedExample],
        spec: BatchSpec,
        announce: Callable[[str], None] = logger.info,
    ) -> FeatureCache:
        """The cache in ``settings.directory`` for these examples, filled first where it is not
        yet (from its first missing shard on); ``announce`` gets the size before anything is
        written."""
        directory = Path(settings.directory)
        lengths = [min(len(e.input_ids), spec.max_length) for e in examples]
        plan = shard_plan(lengths, SHARD_TOKENS)
        key = fingerprint(target, examples, spec, settings.top_k)
        manifest = _read_manifest(directory, key)
        cache_complete = len(manifest["shards"]) == len(plan)
        started = time.perf_counter()
        if not cache_complete:
            _Filler(directory, target, examples, spec, manifest).fill(plan, settings, announce)
        cache = cls(directory, examples, spec)
        cache.fill_s = 0.0 if cache_complete else time.perf_counter() - started
        return cache

    def batch(self, indices: Sequence[int]) -> TargetBatch:
        """The examples ``indices`` right-padded, as :func:`target_batch` gives them, with the
        targets cut to their kept entries."""
        spec, layout = self.spec, self.layout
        chosen = [self.examples[i] for i in indices]
        ids, mask, _ = pad_examples(chosen, spec.pad_id, spec.max_length, torch.device("cpu"))
        shape = tuple(ids.shape)
        features = torch.zeros(*shape, layout.feature_size)
        logprobs = torch.zeros(*shape, layout.top_k)
        columns = torch.zeros(*shape, layout.top_k, dtype=torch.long)
        in_vocab = torch.zeros(*shape, dtype=torch.bool)
        for row, index in enumerate(indices):
            shard, first = self._where[index]
            arrays = self._arrays[shard]
            n = min(len(self.examples[index].input_ids), spec.max_length)
            rows = slice(first, first + n)
            features[row, :n] = _as_float(arrays["features"][rows], layout.feature_dtype)
            logprobs[row, :n] = torch.from_numpy(np.array(arrays["logprobs"][rows])).float()
            columns[row, :n] = torch.from_numpy(np.array(arrays["columns"][rows])).long()
            in_vocab[row, :n] = torch.from_numpy(np.array(arrays["in_vocab"][rows])).bool()
        probs = torch.softmax(logprobs, dim=-1)  # the kept entries, renormalised
        device = spec.device
        targets = DraftTargets(
            probs.to(device), columns.to(device), columns[..., 0].to(device), in_vocab.to(device)
        )
        return TargetBatch(ids.to(device), mask.to(device), features.to(device), targets)


def _as_float(rows: np.ndarray, dtype: str) -> torch.Tensor:
    raw = torch.from_numpy(np.array(rows))
    return (raw.view(torch.bfloat16) if dtype == "bfloat16" else raw).float()


def _shard_path(directory: Path, number: int, name: str) -> Path:
    return directory / f"shard-{number:05d}.{name}"


def _open_shard(
    directory: Path, number: int, layout: CacheLayout, tokens: int, mode: str = "r"
) -> dict[str, np.memmap]:
    arrays = {}
    for name, (dtype, shape) in layout.shapes(tokens).items():
        path = _shard_path(directory, number, name)
        if mode == "w+":
            path = path.with_name(path.name + ".partial")
        arrays[name] = np.memmap(path, dtype=dtype, mode=mode, shape=shape)
    return arrays


def _read_manifest(directory: Path, key: str) -> dict:
    """The manifest of a cache made for ``key``; a new empty one where there is none yet."""
    path = directory / MANIFEST_NAME
    if not path.is_file():
        return {"format": CACHE_FORMAT, "fingerprint": key, "layout": None, "shards": []}
    manifest = json.loads(path.read_text())
    if manifest.get("fingerprint") != key:
        raise ConfigError(
            f"the feature cache in {directory} was made for other examples, another target or "
            "other head settings",
            hint="give this run its own --cache-features directory, or delete the old one",
        )
    return manifest


class _Filler:
    """Writes the missing shards of a cache, one target batch at a time."""

    def __init__(
        self,
        directory: Path,
        target: nn.Module,
        examples: Sequence[TokenizedExample],
        spec: BatchSpec,
        manifest: dict,
    ) -> None:
        self.directory, self.target, self.examples = directory, target, examples
        self.spec, self.manifest = spec, manifest
        self.lengths = [min(len(e.input_ids), spec.max_length) for e in examples]

    def fill(
        self, plan: list[range], settings: CacheSettings, announce: Callable[[str], None]
    ) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.manifest["layout"] is None:
            self.manifest["layout"] = asdict(self._layout(plan[0], settings.top_k))
        layout = CacheLayout(**self.manifest["layout"])
        done = len(self.manifest["shards"])
        missing = sum(self.lengths[i] for shard in plan[done:] for i in shard)
        size = missing * layout.bytes_per_token()
        free = shutil.disk_usage(self.directory).free
        announce(
            f"feature cache: {missing:,} tokens to run through the target, "
            f"{size / 1e9:.2f} GB to write in {self.directory} ({free / 1e9:.1f} GB free)"
        )
        if size > free:
            raise ConfigError(
                f"the feature cache needs {size / 1e9:.2f} GB, {self.directory} has "
                f"{free / 1e9:.1f} GB free",
                hint="choose a --cache-features directory on a larger disk or a smaller "
                "--cache-top-k",
            )
        from tqdm.auto import tqdm

        with tqdm(total=missing, desc="cache target features", unit="tok") as bar:
            for number in range(done, len(plan)):
                mass = self._write_shard(number, plan[number], layout, settings.batch_size, bar)
                self._record(number, plan[number], mass)

    def _layout(self, first_shard: range, top_k: int) -> CacheLayout:
        """Feature size, column type and a feature type that holds this target's features
        (judged on its first batch)."""
        sample = target_batch(self.target, [self.examples[first_shard[0]]], self.spec)
        columns = sample.targets.probs.shape[-1]
        peak = float(sample.features.abs().max())
        return CacheLayout(
            feature_size=int(sample.features.shape[-1]),
            top_k=min(top_k, columns),
            feature_dtype="float16" if peak < FLOAT16_LIMIT / 4 else "bfloat16",
            column_dtype="int16" if columns <= np.iinfo(np.int16).max + 1 else "int32",
        )

    def _write_shard(
        self, number: int, shard: range, layout: CacheLayout, batch_size: int, bar
    ) -> float:
        """Run the target over one shard's examples (longest first, in batches) and write it;
        returns the probability mass its kept entries hold, summed over tokens."""
        starts = np.cumsum([0] + [self.lengths[i] for i in shard])
        arrays = _open_shard(self.directory, number, layout, int(starts[-1]), mode="w+")
        order = sorted(shard, key=lambda i: -self.lengths[i])
        mass = 0.0
        for at in range(0, len(order), max(1, batch_size)):
            chosen = order[at : at + batch_size]
            batch = target_batch(self.target, [self.examples[i] for i in chosen], self.spec)
            top = batch.targets.probs.topk(layout.top_k, dim=-1)  # dense targets, best first
            for row, index in enumerate(chosen):
                n, first = self.lengths[index], int(starts[index - shard.start])
                rows = slice(first, first + n)
                _store_features(arrays["features"], rows, batch.features[row, :n], layout)
                values = top.values[row, :n].float()
                mass += float(values.sum())
                arrays["logprobs"][rows] = values.clamp(min=1e-30).log().cpu().numpy()
                arrays["columns"][rows] = top.indices[row, :n].cpu().numpy()
                arrays["in_vocab"][rows] = batch.targets.in_vocab[row, :n].cpu().numpy()
            bar.update(sum(self.lengths[i] for i in chosen))
        for array in arrays.values():
            array.flush()
        for name in _ARRAYS:
            path = _shard_path(self.directory, number, name)
            path.with_name(path.name + ".partial").replace(path)
        return mass

    def _record(self, number: int, shard: range, mass: float) -> None:
        tokens = sum(self.lengths[i] for i in shard)
        entry = {"first": shard.start, "count": len(shard), "tokens": tokens}
        self.manifest["shards"].append(entry)
        total = sum(s["tokens"] for s in self.manifest["shards"])
        previous = self.manifest.get("kept_mass", 0.0) * (total - tokens)
        self.manifest["kept_mass"] = (previous + mass) / max(1, total)
        partial = self.directory / (MANIFEST_NAME + ".partial")
        partial.write_text(json.dumps(self.manifest, indent=1) + "\n")
        partial.replace(self.directory / MANIFEST_NAME)
        logger.info("feature cache: shard %d written (%d tokens)", number, tokens)


def _store_features(
    array: np.memmap, rows: slice, values: torch.Tensor, layout: CacheLayout
) -> None:
    """Features in the cache's type; float16 saturates rather than overflowing to infinity."""
    values = values.float().cpu()
    if layout.feature_dtype == "float16":
        beyond = int((values.abs() > FLOAT16_LIMIT).sum())
        if beyond:
            logger.warning("feature cache: %d feature values saturated at float16's range", beyond)
        array[rows] = values.clamp(-FLOAT16_LIMIT, FLOAT16_LIMIT).numpy().astype(np.float16)
    else:
        array[rows] = values.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
