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


def test_probes_are_on_by_default_and_off_turns_them_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TURNLOG_PROBES", raising=False)
    assert Settings().probes is True  # a tool that declares a probe expects it to be asked
    monkeypatch.setenv("TURNLOG_PROBES", "off")
    assert Settings().probes is False
    monkeypatch.setenv("TURNLOG_PROBES", "on")
    assert Settings().probes is True
