"""The one facade the UI, the CLI and the HTTP API use: catalog, plan, download, load, chat, race.

Everything it returns is a plain event from backend/events.py. Known failures become a
``GenerationFailed`` / ``LoadFailed`` event (code, message, hint); unknown ones are logged with
their traceback and also end the stream with such an event, so a caller never sees a blank
reply or a traceback. Generations, races and loads take turns on the model through one FIFO
queue (``status().queued``, ``queue_position(request_id)``).

    backend = Backend()
    for event in backend.load(LoadConfig(target="assets/demo/target", head="assets/demo/head-eagle3")):
        ...  # Progress..., then Loaded(info) or LoadFailed
    for event in backend.stream([{"role": "user", "content": "Hi"}], GenerationConfig()):
        ...  # Started, RoundCompleted..., Finished or GenerationFailed
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterator, Sequence
from pathlib import Path

import torch

from backend.config import GenerationConfig, LoadConfig
from backend.engine.device import choose_device
from backend.engine.progress import drain
from backend.engine.stats import SpecStats
from backend.errors import ConfigError, EagleChatError
from backend.events import (
    BackendStatus,
    Downloaded,
    DownloadEvent,
    Finished,
    GenerationEvent,
    GenerationFailed,
    Loaded,
    LoadEvent,
    LoadFailed,
    PairPlan,
    Progress,
    RaceEvent,
    RoundCompleted,
    Started,
    format_bytes,
)
from backend.services import hub_mode, planning, tuning_cache
from backend.services import race as racing
from backend.services.catalog import PairSpec, find_pair, load_catalog
from backend.services.dtypes import choose_dtype
from backend.services.generation_queue import GenerationQueue
from backend.services.loading import LoadedPair, load_steps, prepare
from backend.services.prompting import Message, build_messages, prompt_ids
from backend.services.remote import RemoteEngine

logger = logging.getLogger(__name__)

VANILLA_PROBE_TOKENS = 24  # decode steps timed by vanilla_speed()


class Backend:
    """Holds at most one loaded pair; one job (generation, race, load) runs at a time on it,
    the others wait their turn in arrival order."""

    def __init__(self, catalog_path: str | Path | None = None) -> None:
        self.pair: LoadedPair | None = None
        self._queue = GenerationQueue()
        self._catalog_path = catalog_path
        self._vanilla_speed: float | None = None
        self.remote: RemoteEngine | None = None  # chats go there while connected
        self.remote_baseline: RemoteEngine | None = None  # its race rival without speculation

    # ---- models ------------------------------------------------------------------------------
    def catalog(self) -> list[PairSpec]:
        return load_catalog(self._catalog_path)

    def find_pair(self, name: str) -> PairSpec:
        """The catalog pair called ``name``; a ConfigError names the known ones otherwise."""
        return find_pair(name, self._catalog_path)

    def plan(
        self,
        target: str,
        head: str | None = None,
        dtype: str = "auto",
        quantization: str = "none",
        gguf_file: str | None = None,
    ) -> PairPlan:
        """Download sizes and memory needs of a pair, without downloading or loading anything.

        Raises the typed Hub/config errors (e.g. a repo neither cached nor reachable)."""
        config = LoadConfig(
            target=target, head=head, dtype=dtype, quantization=quantization, gguf_file=gguf_file
        )  # type: ignore[arg-type]
        return planning.plan_pair(config)

    def download(
        self,
        target: str,
        head: str | None = None,
        cancel: threading.Event | None = None,
        gguf_file: str | None = None,
    ) -> Iterator[DownloadEvent]:
        """Fetch what is missing of a pair into the HF cache; local folders need nothing."""
        try:
            target_path = yield from planning.fetch(target, "target", cancel, gguf_file)
            head_path = (yield from planning.fetch(head, "head", cancel)) if head else None
            yield Downloaded(target_path=target_path, head_path=head_path)
        except EagleChatError as err:
            yield LoadFailed(err.code, err.message, err.hint)
        except Exception as err:  # the stream must end with an event, whatever happened
            logger.exception("download failed")
            yield LoadFailed("internal", f"download failed: {err}", "see the log for details")

    def load(self, config: LoadConfig) -> Iterator[LoadEvent]:
        """Resolve (downloading what is missing), validate, then replace the loaded pair.

        The old pair is freed only after the new one passed validation, and before the new
        weights are read, so two models never share the memory. A failure while reading the
        new weights leaves no model loaded (``status().loaded`` is None)."""
        try:
            self.disconnect_remote()
            pair = yield from self._load_events(config)
            yield Loaded(pair.info)
        except EagleChatError as err:
            yield LoadFailed(err.code, err.message, err.hint)
        except Exception as err:  # the stream must end with an event, whatever happened
            logger.exception("loading failed")
            yield LoadFailed("internal", f"loading failed: {err}", "see the log for details")

    def connect_remote(self, url: str, baseline_url: str | None = None) -> Iterator[LoadEvent]:
        """Chat with an OpenAI-compatible engine at ``url`` from now on (a local pair stays
        loaded as the race's vanilla lane unless ``baseline_url`` names a server without
        speculation). Ends with Loaded(info with ``remote`` set) or LoadFailed."""
        try:
            yield Progress("resolve", 0, 1, "steps", f"connecting to {url}")
            remote = RemoteEngine.connect(url)
            baseline = RemoteEngine.connect(baseline_url) if baseline_url else None
            self.remote, self.remote_baseline = remote, baseline
            yield Loaded(remote.info())
        except EagleChatError as err:
            yield LoadFailed(err.code, err.message, err.hint)

    def disconnect_remote(self) -> None:
        """Back to local decoding."""
        self.remote = self.remote_baseline = None

    def load_blocking(self, config: LoadConfig) -> LoadedPair:
        """``load`` for the CLI: progress goes to the log (a line per stage and every tenth of
        it, not one per event), known failures raise typed errors."""
        return drain(self._load_events(config), ProgressLog(logger.info))

    def unload(self) -> None:
        """Free the loaded pair (waits for the running job, if any) and leave a remote engine."""
        self.disconnect_remote()
        with self._queue.turn(_new_id()):
            self._free()

    def reset_tuning(self) -> None:
        """Forget what the round auto-tuner learned of the loaded pair, here and on disk: the
        next reply starts from the prior, as on a first launch (for a tuner stuck on a shape after
        an unusual run). Waits for the running job; raises EagleChatError without a local pair,
        and OSError when the saved state cannot be deleted."""
        with self._queue.turn(_new_id()):  # the pair loaded once the running job is done
            pair = self._require_pair()
            if pair.tuning_key is None:
                raise EagleChatError(
                    "the loaded pair keeps no tuning state to reset",
                    hint="load a pair on this machine first",
                    code="no_tuning",
                )
            pair.engine.policies.clear()  # the same dict is what is saved at exit
            tuning_cache.forget(pair.tuning_key)
            pair.info = dataclasses.replace(pair.info, tree_tuning="new")
        logger.info("tree tuning of %s reset", pair.info.target)

    def status(self) -> BackendStatus:
        info = self.pair.info if self.pair is not None else None
        if self.remote is not None:
            info = self.remote.info()
        return BackendStatus(loaded=info, busy=self._queue.busy, queued=self._queue.queued)

    def queue_position(self, request_id: str) -> int | None:
        """0 while the request runs, n while it is n-th in line, None otherwise."""
        return self._queue.position(request_id)

    # ---- generation --------------------------------------------------------------------------
    def stream(
        self,
        messages: Sequence[Message],
        config: GenerationConfig,
        system_prompt: str | None = None,
        raw: bool = False,
        cancel: threading.Event | None = None,
        request_id: str | None = None,
    ) -> Iterator[GenerationEvent]:
        """One reply, streamed. Waits in the queue first; cancelled while waiting, it ends
        with Started + Finished(stop_reason="cancelled") without touching the model."""
        request_id = request_id or _new_id()
        remote, baseline = self.remote, self.remote_baseline
        if remote is not None:  # the server schedules its own requests: no local queue
            server = baseline if config.mode == "vanilla" and baseline is not None else remote
            prompt = build_messages(messages, system_prompt)
            yield from server.stream(prompt, config, cancel, request_id)
            return
        yield from self._local_stream(messages, config, system_prompt, raw, cancel, request_id)

    def _local_stream(
        self,
        messages: Sequence[Message],
        config: GenerationConfig,
        system_prompt: str | None,
        raw: bool,
        cancel: threading.Event | None,
        request_id: str,
    ) -> Iterator[GenerationEvent]:
        try:
            self._require_pair()
            with self._queue.turn(request_id, cancel) as got_turn:
                if not got_turn:
                    yield Started(request_id, config.mode, 0)
                    yield Finished(request_id, SpecStats().summary([], "", 0.0, "cancelled"))
                    return
                pair = self._require_pair()  # the model may have changed while waiting
                _require_drafter(pair, config.mode)
                ids = prompt_ids(
                    pair.tokenizer,
                    build_messages(messages, system_prompt),
                    raw=raw,
                    prompt_format=pair.prompt_format,
                )
                yield from pair.engine.generate(ids, config, cancel, request_id)
        except EagleChatError as err:
            yield GenerationFailed(request_id, err.code, err.message, err.hint)
        except Exception as err:  # the stream must end with an event, whatever happened
            logger.exception("generation failed")
            yield GenerationFailed(request_id, "internal", f"generation failed: {err}", "")

    def race(
        self,
        messages: Sequence[Message],
        config: GenerationConfig,
        system_prompt: str | None = None,
        cancel: threading.Event | None = None,
        request_id: str | None = None,
    ) -> Iterator[RaceEvent]:
        """Vanilla versus EAGLE decoding of the same prompt on the loaded target, both lanes
        streamed live; ends with RaceFinished (speedup from each lane's own compute time)."""
        request_id = request_id or _new_id()
        if self.remote is not None:
            yield from self._remote_race(
                self.remote, messages, config, system_prompt, cancel, request_id
            )
            return
        try:
            self._require_pair()
            with self._queue.turn(request_id, cancel) as got_turn:
                if not got_turn:
                    yield GenerationFailed(request_id, "cancelled", "the race was cancelled")
                    return
                pair = self._require_pair()
                _require_drafter(pair, "eagle")
                ids = prompt_ids(
                    pair.tokenizer,
                    build_messages(messages, system_prompt),
                    prompt_format=pair.prompt_format,
                )
                lanes = {
                    lane: pair.engine.generate(
                        ids, dataclasses.replace(config, mode=lane), cancel, f"{request_id}-{lane}"
                    )
                    for lane in ("vanilla", "eagle")
                }
                yield from racing.interleave(lanes["vanilla"], lanes["eagle"])
        except EagleChatError as err:
            yield GenerationFailed(request_id, err.code, err.message, err.hint)
        except Exception as err:  # the stream must end with an event, whatever happened
            logger.exception("race failed")
            yield GenerationFailed(request_id, "internal", f"race failed: {err}", "")

    def vanilla_speed(self) -> float | None:
        """Plain decoding speed of the loaded target in tokens/s, measured once per loaded pair
        (a short greedy generation, prefill excluded); None when nothing is loaded."""
        if self.pair is None or self.remote is not None:
            return None
        if self._vanilla_speed is None:
            with self._queue.turn(_new_id()):
                pair = self.pair
                if pair is None:
                    return None
                config = GenerationConfig(
                    mode="vanilla", max_new_tokens=VANILLA_PROBE_TOKENS, stop_on_eos=False
                )
                ids = prompt_ids(
                    pair.tokenizer,
                    [{"role": "user", "content": "Hello"}],
                    prompt_format=pair.prompt_format,
                )
                rounds = [
                    event
                    for event in pair.engine.tokens_only().generate(ids, config)
                    if isinstance(event, RoundCompleted) and event.round_index > 0
                ]
                seconds = sum(r.draft_s + r.verify_s + r.bookkeeping_s for r in rounds)
                tokens = sum(len(r.token_ids) for r in rounds)
                self._vanilla_speed = tokens / seconds if seconds > 0 else None
        return self._vanilla_speed

    def choose_hub_mode(self, asked_offline: bool = False) -> str | None:
        """Offline for this run when asked or when the Hub cannot be reached (a short bounded
        probe); returns why it is offline, or None when downloads are possible."""
        return hub_mode.choose_hub_mode(asked_offline)

    def default_dtype(self, preferred: str = "auto") -> str:
        """The dtype "auto" picks on this machine for a pair whose catalog prefers
        ``preferred`` (e.g. float32 instead of the catalog's bfloat16 on a CPU)."""
        return choose_dtype("auto", choose_device(), preferred)

    def estimated_vanilla_speed(self) -> float | None:
        """Plain decoding speed predicted from the tree auto-tuner's calibration (the timed
        one-token forward), without running anything: an estimate, not a measurement. None
        for a pair without a head (nothing is calibrated then)."""
        pair = self.pair
        if pair is None or pair.engine.costs is None:
            return None
        step_s = pair.engine.costs.verify(1)
        return 1.0 / step_s if step_s > 0 else None

    # ---- internals ---------------------------------------------------------------------------
    def _remote_race(
        self,
        remote: RemoteEngine,
        messages: Sequence[Message],
        config: GenerationConfig,
        system_prompt: str | None,
        cancel: threading.Event | None,
        request_id: str,
    ) -> Iterator[RaceEvent]:
        """The remote engine against its baseline server, or against this machine's vanilla
        decoding of the loaded pair; lanes run one after the other."""
        if self.remote_baseline is None and self.pair is None:
            yield GenerationFailed(
                request_id,
                "no_baseline",
                "nothing to race the remote engine against",
                "start a server without speculation and pass it as the baseline "
                "(python launch.py app --remote URL --remote-baseline URL), or add "
                "--target/--head to race against this machine's vanilla decoding",
            )
            return
        prompt = build_messages(messages, system_prompt)
        vanilla_config = dataclasses.replace(config, mode="vanilla")
        lane_id = f"{request_id}-vanilla"
        if self.remote_baseline is not None:
            vanilla = self.remote_baseline.stream(prompt, vanilla_config, cancel, lane_id)
        else:
            vanilla = self._local_stream(prompt, vanilla_config, None, False, cancel, lane_id)
        eagle = remote.stream(prompt, config, cancel, f"{request_id}-eagle")
        try:
            yield from racing.one_after_the_other(vanilla, eagle)
        except Exception as err:  # the stream must end with an event, whatever happened
            logger.exception("remote race failed")
            yield GenerationFailed(request_id, "internal", f"race failed: {err}", "")

    def _load_events(self, config: LoadConfig) -> Generator[Progress, None, LoadedPair]:
        yield Progress("resolve", 0, 3, "steps", f"locating {config.target}")
        target_path = yield from planning.fetch(config.target, "target", None, config.gguf_file)
        head_path = (yield from planning.fetch(config.head, "head", None)) if config.head else None
        needed = planning.local_weight_bytes(config, target_path, head_path)
        yield Progress("resolve", 1, 3, "steps", f"weights need about {format_bytes(needed)}")
        planning.check_memory_fits(needed, config)
        config = self._with_catalog_format(config)
        prepared = prepare(config, target_path, head_path, self._catalog_kind(config.head))
        yield Progress("resolve", 2, 3, "steps", "head and target fit together")
        with self._queue.turn(_new_id()):
            self._free()
            self.pair = yield from load_steps(prepared)
        return self.pair

    def _free(self) -> None:
        """Drop the loaded pair and give its memory back before anything new is loaded."""
        if self.pair is None:
            return
        logger.info("unloading %s", self.pair.info.target)
        if self.pair.tuning_key is not None:
            tuning_cache.save(self.pair.engine.policies, self.pair.tuning_key)
        self.pair = None
        self._vanilla_speed = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _catalog_kind(self, head: str | None) -> str | None:
        """The head kind the catalog promises for ``head``, checked against the checkpoint."""
        if head is None:
            return None
        return next((pair.head_kind for pair in self._known_pairs() if pair.head == head), None)

    def _with_catalog_format(self, config: LoadConfig) -> LoadConfig:
        """``auto`` becomes the conversation format the catalog names for this target (the one
        its heads were trained with, e.g. Vicuna v1.1 for targets without a chat template)."""
        if config.prompt_format != "auto":
            return config
        named = next(
            (
                p.prompt_format
                for p in self._known_pairs()
                if p.target == config.target and p.prompt_format != "auto"
            ),
            None,
        )
        return config if named is None else dataclasses.replace(config, prompt_format=named)

    def _known_pairs(self) -> list[PairSpec]:
        try:
            return self.catalog()
        except ConfigError as err:
            logger.warning("catalog unreadable, nothing cross-checked against it: %s", err)
            return []

    def _require_pair(self) -> LoadedPair:
        if self.pair is None:
            raise EagleChatError(
                "no model is loaded", hint="load a target (and head) first", code="no_model"
            )
        return self.pair


class ProgressLog:
    """Logs load progress as a reader wants it: each new message once, then while it repeats
    (a long stage counting its steps) one line per tenth done or per ``every_s`` seconds, and
    its end. A first load emits hundreds of calibration events, which a line each would bury
    the rest of the log in."""

    def __init__(
        self,
        log: Callable[..., None],
        every_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log, self.every_s, self.clock = log, every_s, clock
        self._last: tuple[str, float, float] | None = None  # message, fraction, time logged

    def __call__(self, event: Progress) -> None:
        fraction = event.done / event.total if event.total else None
        now = self.clock()
        last = self._last
        new_stage = last is None or last[0] != event.message
        due = (
            new_stage
            or fraction is None
            or fraction >= 1.0
            or fraction - last[1] >= 0.1
            or now - last[2] >= self.every_s
        )
        if not due:
            return
        if new_stage or fraction is None:  # a step's own fraction is the load's, not its own
            self.log("%s", event.message)
        else:
            self.log("%s (%d%%)", event.message, int(100 * fraction))
        self._last = (event.message, fraction or 0.0, now)


def _require_drafter(pair: LoadedPair, mode: str) -> None:
    if mode == "eagle" and pair.engine.drafter is None:
        raise ConfigError(
            "EAGLE mode needs a draft head, and none is loaded",
            hint="load a head with the target, or choose vanilla mode",
        )


def _new_id() -> str:
    return uuid.uuid4().hex[:12]
