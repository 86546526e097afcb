"""The bench rows run by another model than the loaded pair's, in the same interleaved run:
- ``--quantize int8`` (or 8bit/4bit): vanilla decoding of the unquantized float32 target, and how
  closely the quantized target follows it on the prompts' text (fidelity.py);
- ``--peer llama.cpp``: plain llama.cpp decoding of the target's GGUF file (peers/llamacpp.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from backend.bench.fidelity import compare
from backend.bench.prompts import BenchPrompt
from backend.bench.runner import FLOAT_BASELINE, LLAMA_CPP, Peer, run_engine
from backend.config import LoadConfig
from backend.services.loading import LoadedPair, load_pair
from backend.services.prompting import prompt_ids

logger = logging.getLogger(__name__)

PEERS = (LLAMA_CPP,)


@dataclass
class OtherRows:
    """The peers to interleave, what the report says about them, and how to stop them."""

    peers: dict[str, Peer] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        for close in self.closers:
            close()


def start_other_rows(
    pair: LoadedPair, config: LoadConfig, prompts: list[BenchPrompt], peer: str | None
) -> OtherRows:
    """Load or start what the extra rows need: the float32 target when ``config`` quantizes
    (its fidelity measured at once), the ``peer`` program when one is named."""
    rows = OtherRows()
    if config.quantization != "none":
        reference = load_pair(replace(config, head=None, quantization="none", dtype="float32"))
        rows.peers[FLOAT_BASELINE] = lambda ids, generation: run_engine(reference, ids, generation)
        encoded = [_ids(pair, prompt) for prompt in prompts]
        fidelity = compare(pair.model, reference.model, encoded)
        logger.info("fidelity of the %s target: %s", config.quantization, fidelity)
        rows.settings["fidelity"] = fidelity.to_json()
        rows.settings["quantized_weights"] = pair.info.weights
    if peer == LLAMA_CPP:
        from backend.bench.peers.llamacpp import LlamaCppPeer

        program = LlamaCppPeer(pair.target_path, torch.get_num_threads(), pair.engine.eos_ids)
        rows.peers[LLAMA_CPP] = program.run
        rows.closers.append(program.close)
    return rows


def _ids(pair: LoadedPair, prompt: BenchPrompt) -> list[int]:
    message = [{"role": "user", "content": prompt.text}]
    return prompt_ids(pair.tokenizer, message, prompt_format=pair.prompt_format)
