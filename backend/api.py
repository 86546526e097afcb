"""The one facade the UI, the CLI and the HTTP API use: load a pair, stream a generation.

Everything it returns is a plain event from backend/events.py. Known failures become a
``GenerationFailed`` event (code, message, hint); unknown ones are logged with their traceback
and also end the stream with a ``GenerationFailed``, so a caller never sees a blank reply.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator, Sequence

from backend.config import GenerationConfig, LoadConfig
from backend.engine.loop import generate
from backend.errors import ConfigError, EagleChatError
from backend.events import GenerationEvent, GenerationFailed
from backend.services.loading import LoadedPair, load_pair
from backend.services.prompting import Message, build_messages, prompt_ids

logger = logging.getLogger(__name__)


class Backend:
    """Holds at most one loaded pair; one generation runs at a time, others wait their turn."""

    def __init__(self) -> None:
        self.pair: LoadedPair | None = None
        self._generation_lock = threading.Lock()

    def load(self, config: LoadConfig) -> LoadedPair:
        self.pair = load_pair(config)
        return self.pair

    def stream(
        self,
        messages: Sequence[Message],
        config: GenerationConfig,
        system_prompt: str | None = None,
        raw: bool = False,
        cancel: threading.Event | None = None,
    ) -> Iterator[GenerationEvent]:
        request_id = uuid.uuid4().hex[:12]
        try:
            pair = self._require_pair()
            if config.mode == "eagle" and pair.drafter is None:
                raise ConfigError(
                    "EAGLE mode needs a draft head, and none is loaded",
                    hint="load a head with the target, or choose vanilla mode",
                )
            ids = prompt_ids(pair.tokenizer, build_messages(messages, system_prompt), raw=raw)
            with self._generation_lock:
                yield from generate(
                    pair.runner, pair.drafter, ids, config, eos_ids=pair.eos_ids,
                    tokenizer=pair.tokenizer, cancel=cancel, request_id=request_id,
                )  # fmt: skip
        except EagleChatError as err:
            yield GenerationFailed(request_id, err.code, err.message, err.hint)
        except Exception as err:  # the stream must end with an event, whatever happened
            logger.exception("generation failed")
            yield GenerationFailed(request_id, "internal", f"generation failed: {err}", "")

    def _require_pair(self) -> LoadedPair:
        if self.pair is None:
            raise EagleChatError("no model is loaded", hint="load a target (and head) first")
        return self.pair
