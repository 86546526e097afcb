"""A scripted stand-in for backend.api.Backend, so UI handlers are tested without a model.

It speaks the same event types as the real backend (backend/events.py) and records what it
was asked, so tests can check the requests the UI builds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from backend.config import GenerationConfig, LoadConfig, TreeConfig
from backend.errors import ConfigError, EagleChatError
from backend.events import (
    BackendStatus,
    Downloaded,
    Finished,
    GenerationFailed,
    GenerationSummary,
    Loaded,
    LoadFailed,
    PairInfo,
    PairPlan,
    Progress,
    RaceFinished,
    RaceUpdate,
    RepoSize,
    RoundCompleted,
    Started,
    TextSpan,
    average_acceptance_length,
)
from backend.services.catalog import PairSpec

# (spans, accepted drafts) per round; round 0 is the prefill's token.
SCRIPT: tuple[tuple[tuple[tuple[str, str], ...], int], ...] = (
    ((("Hello", "target"),), 0),
    (((" there", "head"), (",", "head"), (" friend", "target")), 2),
    (((" how", "target"),), 0),
    (((" are", "head"), (" you", "head"), (" today", "head"), ("?", "target")), 3),
)


def make_info(target: str = "fake/target", head: str | None = "fake/head") -> PairInfo:
    return PairInfo(
        target=target,
        head=head,
        head_kind="eagle3" if head else None,
        architecture="Fake",
        dtype="float32",
        device="cpu",
        quantization="none",
        parameters=1_000_000,
        vocab_size=300,
        max_context=512,
    )


def summary_of(
    rounds: Sequence[RoundCompleted], stop_reason: str = "eos", seconds: float = 0.4
) -> GenerationSummary:
    verify = [r for r in rounds if r.round_index > 0]
    token_ids = tuple(t for r in rounds for t in r.token_ids)
    return GenerationSummary(
        new_tokens=len(token_ids),
        rounds=len(verify),
        tau=average_acceptance_length(sum(len(r.token_ids) for r in verify), len(verify)),
        acceptance_lengths=tuple(len(r.token_ids) for r in verify),
        accept_per_depth=(),
        tokens_per_s=len(token_ids) / seconds,
        ttft_s=rounds[0].elapsed_s if rounds else 0.0,
        total_s=seconds,
        draft_s=0.0,
        verify_s=0.0,
        stop_reason=stop_reason,  # type: ignore[arg-type]
        text="".join(s.text for r in rounds for s in r.spans),
        token_ids=token_ids,
    )


Script = tuple[tuple[tuple[tuple[str, str], ...], int], ...]


def scripted_rounds(
    request_id: str = "r", vanilla: bool = False, script: Script = SCRIPT
) -> list[RoundCompleted]:
    rounds = []
    next_id = 10
    for index, (spans, accepted) in enumerate(script):
        pieces = tuple(TextSpan(text, "target" if vanilla else source) for text, source in spans)
        ids = tuple(range(next_id, next_id + len(pieces)))
        next_id += len(pieces)
        rounds.append(
            RoundCompleted(
                request_id=request_id,
                round_index=index,
                token_ids=ids,
                spans=pieces,
                num_accepted_drafts=0 if vanilla else accepted,
                tree_size=1 if vanilla else 8,
                draft_s=0.03,  # the parts of a round fill the 0.1 s between events
                verify_s=0.06,
                bookkeeping_s=0.01,
                elapsed_s=0.1 * (index + 1),
            )
        )
    return rounds


@dataclass
class FakeBackend:
    loaded: PairInfo | None = field(default_factory=make_info)
    fail_with: GenerationFailed | None = None  # stream ends with this after the first round
    delay_s: float = 0.0  # pause between rounds, to test Stop
    script: Script = SCRIPT  # the reply every stream produces
    calls: list[tuple[str, Any]] = field(default_factory=list)
    calibrated_speed: float | None = None  # plain-step speed known from calibration

    def catalog(self) -> list[PairSpec]:
        return [
            PairSpec(
                name="demo",
                target="/x/demo/target",
                head="/x/demo/head",
                head_kind="eagle3",
                target_gb=0.05,
                head_gb=0.01,
                gated=False,
                tree=TreeConfig(12, 5, 4),
                dtype="float32",
                note="Bundled tiny pair.",
                offline=True,
            ),
            PairSpec(
                name="gated-pair",
                target="org/target",
                head="org/head",
                head_kind="eagle1",
                target_gb=13.5,
                head_gb=0.8,
                gated=True,
                tree=TreeConfig(60, 6, 10),
                dtype="float16",
            ),
        ]

    def plan(
        self, target: str, head: str | None = None, dtype: str = "auto", quantization: str = "none"
    ) -> PairPlan:
        self.calls.append(("plan", (target, head, dtype, quantization)))
        side = RepoSize(target, "hub", 2_000_000_000, 500_000_000, gated=True, from_cache=False)
        head_side = RepoSize(head, "local", 40_000_000, 40_000_000, False, True) if head else None
        return PairPlan(
            target=side,
            head=head_side,
            dtype="float32",
            quantization=quantization,
            device="cpu",
            parameters=1_000_000_000,
            head_parameters=10_000_000,
            parameters_source="safetensors",
            memory_bytes=4_040_000_000,
            kv_bytes_per_token=4096,
            bytes_to_download=1_500_000_000,
            offline=False,
            ready=False,
        )

    def download(
        self, target: str, head: str | None = None, cancel: threading.Event | None = None
    ) -> Iterator[Any]:
        self.calls.append(("download", (target, head)))
        for done in (0, 500_000, 1_000_000):
            yield Progress("download", done, 1_000_000, "bytes", "model.safetensors")
        yield Downloaded(
            target_path=f"/cache/{target}", head_path=f"/cache/{head}" if head else None
        )

    def load(self, config: LoadConfig) -> Iterator[Any]:
        self.calls.append(("load", config))
        yield Progress("resolve", 0, 3, "steps", f"locating {config.target}")
        if config.target == "missing/model":
            yield LoadFailed("repo_not_found", "missing/model is not on the Hub", "check the id")
            return
        yield Progress("load", 2, 3, "steps", "reading weights")
        self.loaded = make_info(config.target, config.head)
        yield Loaded(self.loaded)

    def unload(self) -> None:
        self.loaded = None

    def reset_tuning(self) -> None:
        self.calls.append(("reset_tuning", None))
        if self.loaded is None:
            raise EagleChatError("no model is loaded", hint="load a target", code="no_model")
        self.loaded = replace(self.loaded, tree_tuning="new")

    def status(self) -> BackendStatus:
        return BackendStatus(loaded=self.loaded, busy=False, queued=0)

    def vanilla_speed(self) -> float | None:
        return 50.0 if self.loaded else None

    def choose_hub_mode(self, asked_offline: bool = False) -> str | None:
        return "offline mode was asked for (--offline)" if asked_offline else None

    def find_pair(self, name: str) -> PairSpec:
        pairs = self.catalog()
        found = next((pair for pair in pairs if pair.name == name), None)
        if found is None:
            known = ", ".join(pair.name for pair in pairs)
            raise ConfigError(f"unknown pair {name!r}", hint=f"known pairs: {known}")
        return found

    def default_dtype(self, preferred: str = "auto") -> str:
        return "float32"  # what a CPU without bf16 matrix units gets

    def estimated_vanilla_speed(self) -> float | None:
        return self.calibrated_speed if self.loaded else None

    def stream(
        self,
        messages: Sequence[dict[str, str]],
        config: GenerationConfig,
        system_prompt: str | None = None,
        raw: bool = False,
        cancel: threading.Event | None = None,
    ) -> Iterator[Any]:
        self.calls.append(("stream", (list(messages), config, system_prompt)))
        yield Started("r", config.mode, 5)
        done: list[RoundCompleted] = []
        for event in scripted_rounds(vanilla=config.mode == "vanilla", script=self.script):
            if cancel is not None and cancel.is_set():
                yield Finished("r", summary_of(done, "cancelled"))
                return
            done.append(event)
            yield event
            if self.fail_with is not None:
                yield self.fail_with
                return
            time.sleep(self.delay_s)
        yield Finished("r", summary_of(done))

    def race(
        self,
        messages: Sequence[dict[str, str]],
        config: GenerationConfig,
        system_prompt: str | None = None,
        cancel: threading.Event | None = None,
    ) -> Iterator[Any]:
        self.calls.append(("race", (list(messages), config)))
        vanilla, eagle = scripted_rounds(vanilla=True), scripted_rounds()
        for lane, rounds in (("vanilla", vanilla), ("eagle", eagle)):
            for event in rounds:
                yield RaceUpdate(lane, event)  # type: ignore[arg-type]
        slow, fast = summary_of(vanilla, seconds=0.8), summary_of(eagle, seconds=0.4)
        for lane, summary in (("vanilla", slow), ("eagle", fast)):
            yield RaceUpdate(lane, Finished("r", summary))  # type: ignore[arg-type]
        yield RaceFinished(
            vanilla=slow, eagle=fast, speedup=2.0, identical=True, first_divergence=None
        )
