"""Test session setup: offline Hub, no analytics, deterministic CPU threads."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
# Measured tree costs and GGUF conversions go to a per-session folder, never into the user's
# ~/.cache; removed at exit (after the tuner's own exit hook saved into it), since a Gemma
# conversion alone fills a gigabyte per session.
if "EAGLECHAT_CACHE_DIR" not in os.environ:
    os.environ["EAGLECHAT_CACHE_DIR"] = tempfile.mkdtemp(prefix="eaglechat-test-cache-")
    atexit.register(shutil.rmtree, os.environ["EAGLECHAT_CACHE_DIR"], ignore_errors=True)

import pytest  # noqa: E402
import torch  # noqa: E402

# Tiny models are fastest on one thread, and several threads fight each other on 2 cores.
torch.set_num_threads(1)


@pytest.fixture
def four_threads():
    """The process on four intra-op threads for the test, restored afterwards."""
    previous = torch.get_num_threads()
    torch.set_num_threads(4)
    yield
    torch.set_num_threads(previous)
