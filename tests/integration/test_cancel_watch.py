"""The watch beside a running tool call, when its process stops under it."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from tests.fault.cluster import poll
from turnlog.application.execution.cancel_watch import CancelWatch, Watcher
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


class _Counting(threading.Condition):
    def __init__(self) -> None:
        super().__init__()
        self.notified = 0

    def notify(self, n: int = 1) -> None:
        self.notified += 1
        super().notify(n)


class _Due:
    """A watch as the watcher sees one: when it is due, and its looks."""

    def __init__(self, seconds: float) -> None:
        self.next_look = time.monotonic() + seconds
        self.looked = threading.Event()

    def look(self) -> None:
        self.next_look = time.monotonic() + 3600
        self.looked.set()


def test_a_watch_due_no_sooner_than_the_watcher_wakes_does_not_wake_it() -> None:
    watcher = Watcher()
    counting = _Counting()
    watcher._cond = counting
    first = _Due(3600)
    watcher.add(first)  # type: ignore[arg-type]
    poll(lambda: watcher._wakes_at is not None, 60, "the watcher to wait for the first watch")
    assert counting.notified == 1

    watcher.add(_Due(7200))  # type: ignore[arg-type]  # due later: the watcher sleeps on
    assert counting.notified == 1

    soon = _Due(0.01)
    watcher.add(soon)  # type: ignore[arg-type]  # due sooner: woken to wait less
    assert counting.notified == 2
    poll(soon.looked.is_set, 60, "the sooner watch to be looked at")
    assert not first.looked.is_set()
