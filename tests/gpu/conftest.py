"""Fixtures the GPU tests share with the CPU tests they mirror: the easy pair saved once per
session (tests/services) and the tiny Llama target saved for offloading (test_offload)."""

from __future__ import annotations

from tests.services.conftest import saved_pairs  # noqa: F401
from tests.services.test_offload import saved  # noqa: F401
