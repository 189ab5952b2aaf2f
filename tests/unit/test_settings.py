"""Settings read from the environment: what an empty or spelled-out value means."""

from __future__ import annotations

import pytest

from turnlog.application.settings import Settings


def test_an_empty_tools_file_is_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    # Read as a path, "" is "." (the working directory): "Is a directory" at start-up.
    monkeypatch.setenv("TURNLOG_TOOLS_FILE", "")
    assert Settings().tools_file is None
    monkeypatch.setenv("TURNLOG_TOOLS_FILE", "  ")
    assert Settings().tools_file is None


def test_a_tools_file_that_is_set_is_a_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURNLOG_TOOLS_FILE", "tools.toml")
    assert str(Settings().tools_file) == "tools.toml"
