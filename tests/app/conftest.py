"""Shared fixtures of the app tests: a tiny saved target/head pair whose drafts are often
accepted, and the real app serving it on 127.0.0.1 (one launch for the whole session)."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from app.main import build_app, launch_options
from backend.api import Backend
from backend.config import LoadConfig
from backend.events import Loaded
from models.checkpoints import save_head
from tests.factories import easy_llama_pair, tiny_tokenizer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SavedPair:
    target: Path
    head: Path


@dataclass(frozen=True)
class LiveApp:
    url: str
    backend: Backend
    pair: SavedPair


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory) -> SavedPair:
    """easy_llama_pair (the head knows the target's next-token rule, so long accepted runs
    happen) with a real tokenizer; special tokens get zero logits so replies run to
    max_new_tokens instead of stopping at a random EOS."""
    base = tmp_path_factory.mktemp("app-pair")
    tokenizer = tiny_tokenizer(base / "target")
    target, head = easy_llama_pair(vocab_size=len(tokenizer))
    with torch.no_grad():
        for token_id in tokenizer.all_special_ids:
            target.lm_head.weight[token_id].zero_()
    target.generation_config.eos_token_id = tokenizer.eos_token_id
    target.save_pretrained(base / "target")
    save_head(head, base / "head")
    return SavedPair(base / "target", base / "head")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def live_app(tiny_pair: SavedPair) -> Iterator[LiveApp]:
    backend = Backend()
    config = LoadConfig(target=str(tiny_pair.target), head=str(tiny_pair.head))
    events = list(backend.load(config))
    assert isinstance(events[-1], Loaded), events[-1]
    demo = build_app(backend, initial=config)
    demo.queue(default_concurrency_limit=1)
    _, url, _ = demo.launch(
        server_name="127.0.0.1",
        server_port=free_port(),
        prevent_thread_lock=True,
        quiet=True,
        **launch_options(),
    )
    try:
        yield LiveApp(url=url.rstrip("/"), backend=backend, pair=tiny_pair)
    finally:
        demo.close()
