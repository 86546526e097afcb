"""The error types the app, the front ends and the backend raise and catch.

They are defined in :mod:`models.errors` (the model code raises them too and must not import
the backend); this module is the backend's public name for them.
"""

from __future__ import annotations

from models.errors import (
    CheckpointError,
    ConfigError,
    DiskFullError,
    EagleChatError,
    GatedRepoError,
    GenerationCancelled,
    HubError,
    IncompatibleHeadError,
    InputError,
    NetworkError,
    RepoNotFoundError,
    ResourceError,
)

__all__ = [
    "CheckpointError",
    "ConfigError",
    "DiskFullError",
    "EagleChatError",
    "GatedRepoError",
    "GenerationCancelled",
    "HubError",
    "IncompatibleHeadError",
    "InputError",
    "NetworkError",
    "RepoNotFoundError",
    "ResourceError",
]
