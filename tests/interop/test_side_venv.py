"""A missing side venv fails the test that needs it, with the command that creates it."""

from __future__ import annotations

import pytest

from tests.interop.side_venv import side_python


def test_missing_side_venv_fails_with_the_command_that_creates_it() -> None:
    with pytest.raises(pytest.fail.Exception, match=r"bash scripts/side-venvs\.sh no-such-venv"):
        side_python("no-such-venv")
