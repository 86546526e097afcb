"""Typed failures that carry a user-facing message and a hint.

Library exceptions are caught at the boundary that understands them and re-raised as one of
these (``raise ... from err``), so the CLI, the UI and the HTTP API can show one clear line
instead of a traceback. They live in models/ so that the model code can raise them without
importing the backend; the app and the backend import them as ``backend.errors``.
"""

from __future__ import annotations


class EagleChatError(Exception):
    """Base of every known failure: ``message`` says what happened, ``hint`` what to do."""

    code: str = "error"

    def __init__(self, message: str, hint: str = "", code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class ConfigError(EagleChatError):
    """An invalid setting (tree shape, sampling, dtype...)."""

    code = "config"


class InputError(EagleChatError):
    """Bad user input: empty or too-long prompt, bad max_new_tokens."""

    code = "input"


class CheckpointError(EagleChatError):
    """A head checkpoint whose files or keys do not match the expected format."""

    code = "checkpoint"


class IncompatibleHeadError(EagleChatError):
    """A head that does not fit its target (hidden size, vocab, layers, architecture)."""

    code = "incompatible_head"


class HubError(EagleChatError):
    """Any failure talking to the Hugging Face Hub."""

    code = "hub"


class GatedRepoError(HubError):
    code = "gated_repo"


class RepoNotFoundError(HubError):
    code = "repo_not_found"


class NetworkError(HubError):
    code = "network"


class DiskFullError(HubError):
    code = "disk_full"


class ResourceError(EagleChatError):
    """Not enough memory (host or accelerator) for what was asked."""

    code = "resource"


class GenerationCancelled(EagleChatError):
    code = "cancelled"
