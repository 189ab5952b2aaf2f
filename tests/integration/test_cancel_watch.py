"""The watch beside a running tool call, when its process stops under it."""

from __future__ import annotations

import logging
import threading

import pytest

from tests.fault.cluster import poll
from turnlog.application.cancel_watch import CancelWatch, Watcher
from turnlog.application.settings import Settings
from turnlog.domain.turns import Effect
from turnlog.interface.bootstrap import build_runtime


def test_a_watch_whose_process_closed_its_pool_ends_without_a_traceback(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    rt = build_runtime(settings)
    session_id = rt.sessions.create_session().session_id
    watcher = Watcher()
    watch = CancelWatch(
        rt.sessions,
        session_id,
        "t-1",
        "c-1",
        1,
        Effect.READ_ONLY,
        threading.Event(),
        None,
        0.01,
        watcher=watcher,
    )
    caplog.set_level(logging.DEBUG, logger="turnlog.execution")
    with watch:
        assert watcher.watching == 1
        rt.close()  # as a stopping process does while a call still runs
        poll(lambda: watch.ended, 60, "the watch ends once it sees the close")
        assert watcher.watching == 0
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert "the process is stopping" in caplog.text
