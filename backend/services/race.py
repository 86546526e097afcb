"""EAGLE versus vanilla on the same target, both lanes streamed live and timed fairly.

The two generators run in one thread, so a lane's wall clock would include the time the other
lane was computing. Each lane is therefore timed by its own compute only: the engine times
every round (``draft_s + verify_s + bookkeeping_s``; round 0 is the prefill), and the lane's
summary, ``elapsed_s`` values and speed are rebuilt from those. The scheduler always advances
the lane with less compute so far, so on screen both lanes progress as if they ran side by side
on two identical devices.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from backend.events import (
    Finished,
    GenerationEvent,
    GenerationFailed,
    GenerationSummary,
    RaceEvent,
    RaceFinished,
    RaceLane,
    RaceUpdate,
    RoundCompleted,
    first_divergence,
)

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Lane:
    name: RaceLane
    events: Iterator[GenerationEvent]
    compute_s: float = 0.0  # this lane's own compute so far
    ttft_s: float = 0.0
    summary: GenerationSummary | None = None


def interleave(
    vanilla: Iterator[GenerationEvent], eagle: Iterator[GenerationEvent]
) -> Iterator[RaceEvent]:
    """RaceUpdate events of both lanes (fair order, own-compute timings), then RaceFinished.

    A failing lane ends the race with its GenerationFailed; the other lane is closed."""
    lanes = [_Lane("vanilla", vanilla), _Lane("eagle", eagle)]
    running = list(lanes)
    while running:
        lane = min(running, key=lambda candidate: candidate.compute_s)
        event = next(lane.events, None)
        if event is None:
            running.remove(lane)
            continue
        if isinstance(event, GenerationFailed):
            for other in running:
                close = getattr(other.events, "close", None)
                if close is not None:
                    close()
            yield event
            return
        if isinstance(event, RoundCompleted):
            lane.compute_s += event.draft_s + event.verify_s + event.bookkeeping_s
            if event.round_index == 0:
                lane.ttft_s = lane.compute_s
            event = dataclasses.replace(event, elapsed_s=lane.compute_s)
        elif isinstance(event, Finished):
            lane.summary = own_compute_summary(event.summary, lane.compute_s, lane.ttft_s)
            event = dataclasses.replace(event, summary=lane.summary)
            running.remove(lane)
        yield RaceUpdate(lane=lane.name, event=event)
    vanilla_summary, eagle_summary = lanes[0].summary, lanes[1].summary
    if vanilla_summary is None or eagle_summary is None:
        raise RuntimeError("a race lane ended without a Finished event")
    yield race_result(vanilla_summary, eagle_summary)


def one_after_the_other(
    vanilla: Iterator[GenerationEvent], eagle: Iterator[GenerationEvent]
) -> Iterator[RaceEvent]:
    """A race whose lanes run on a remote engine (and its baseline): each lane runs alone,
    timed by the wall clock of its own stream, so neither slows the other down on a shared
    server. Identity is judged on text when a lane has no token ids."""
    summaries: dict[RaceLane, GenerationSummary] = {}
    for name, events in (("vanilla", vanilla), ("eagle", eagle)):
        for event in events:
            if isinstance(event, GenerationFailed):
                yield event
                return
            if isinstance(event, Finished):
                summaries[name] = event.summary  # type: ignore[index]
            yield RaceUpdate(lane=name, event=event)  # type: ignore[arg-type]
    if set(summaries) != {"vanilla", "eagle"}:
        raise RuntimeError("a race lane ended without a Finished event")
    result = race_result(summaries["vanilla"], summaries["eagle"])
    if not (summaries["vanilla"].token_ids and summaries["eagle"].token_ids):
        same = summaries["vanilla"].text == summaries["eagle"].text
        result = dataclasses.replace(result, identical=same, first_divergence=None)
    yield result


def own_compute_summary(
    summary: GenerationSummary, compute_s: float, ttft_s: float
) -> GenerationSummary:
    """The summary with wall-clock fields replaced by the lane's own compute time."""
    speed = summary.new_tokens / compute_s if compute_s > 0 else 0.0
    return dataclasses.replace(summary, total_s=compute_s, ttft_s=ttft_s, tokens_per_s=speed)


def race_result(vanilla: GenerationSummary, eagle: GenerationSummary) -> RaceFinished:
    divergence = first_divergence(vanilla.token_ids, eagle.token_ids)
    speedup = eagle.tokens_per_s / vanilla.tokens_per_s if vanilla.tokens_per_s > 0 else 0.0
    logger.info(
        "race: vanilla %.1f tok/s, eagle %.1f tok/s (x%.2f), %s",
        vanilla.tokens_per_s,
        eagle.tokens_per_s,
        speedup,
        "identical" if divergence is None else f"diverged at token {divergence}",
    )
    return RaceFinished(
        vanilla=vanilla,
        eagle=eagle,
        speedup=speedup,
        identical=divergence is None,
        first_divergence=divergence,
    )
