"""One ear per process: one follower reads each commit from the log once and tells every part."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from tests.deadlines import poll, scaled
from turnlog.application.settings import Settings
from turnlog.domain.session import Session
from turnlog.interface.bootstrap import Process, build_process
from turnlog.interface.roles import Role

SOURCE = Path(__file__).resolve().parents[2]


@pytest.fixture
def process(settings: Settings) -> Iterator[Process]:
    process = build_process(settings, Role.ALL).start()
    yield process
    process.stop(drain_timeout=5)


def test_one_commit_is_read_from_the_log_once_per_process(process: Process) -> None:
    follower, supervisor, read = process.follower, process.supervisor, process.read_models
    assert follower is not None and supervisor is not None and read is not None
    runtime = process.runtime
    assert runtime is not None
    warm = runtime.sessions.create_session(title="warm-up")  # runners catch up, then follow
    assert read.wait_for(warm.position, timeout=scaled(10))
    poll(lambda: follower.rows_read >= 1, 10, "the follower to read the warm-up")
    rows, own = follower.rows_read, supervisor.own_reads()
    told: list[str] = []
    follower.subscribe(lambda page: told.extend(n.topic for _, n in page.records))

    written = runtime.sessions.create_session(title="once")  # one commit, one event

    assert read.wait_for(written.position, timeout=scaled(10))
    poll(lambda: told, 10, "the follower to hand the event over")
    assert told == [Session.Started.TOPIC]
    assert follower.rows_read == rows + 1  # read once, by the follower
    assert supervisor.own_reads() == own  # the read models folded the follower's page
    [row], _ = read.list_sessions(limit=1)
    assert row["title"] == "once"


def test_the_source_has_one_listener() -> None:
    listeners = [
        f"{path.relative_to(SOURCE)}:{number}"
        for folder in ("domain", "application", "projections", "interface")
        for path in sorted((SOURCE / folder).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"""["']LISTEN \{""", line)  # a LISTEN statement
    ]
    assert listeners == [listeners[0]] and listeners[0].startswith("application/follower.py")


def test_a_wake_up_by_this_process_s_own_writes_waits_for_more_and_another_s_does_not(
    process: Process,
) -> None:
    follower, runtime = process.follower, process.runtime
    assert follower is not None and runtime is not None
    poll(lambda: follower.listening, 10, "the follower to listen")

    gathered = follower.gathered
    runtime.sessions.create_session(title="ours")  # its NOTIFY comes from our pool
    poll(lambda: follower.gathered > gathered, scaled(10), "a wake-up by our write to wait")

    notified, gathered = follower.notifications, follower.gathered
    with psycopg.connect(runtime.db.conninfo, autocommit=True) as other:  # another process's
        other.execute(sql.SQL("NOTIFY {}").format(sql.Identifier(follower.channel)))
        poll(lambda: follower.notifications > notified, scaled(10), "the other's notification")
    assert follower.gathered == gathered  # read at once


def test_a_save_of_a_turn_s_middle_steps_waits_for_the_next_notification(
    process: Process,
) -> None:
    runtime = process.runtime
    assert runtime is not None
    notifier = runtime.sessions.recorder.notifier  # type: ignore[attr-defined]
    notifier.defer = 3600.0  # nothing but a later save or the close may send it
    poll(lambda: notifier.due_in is None, 10, "earlier notifications to go out")
    sent = notifier.sent

    notifier.notify([Session.TurnClaimed.TOPIC, Session.ModelReplied.TOPIC])
    assert notifier.due_in > 3000 and notifier.sent == sent  # deferred

    notifier.notify([Session.ModelReplied.TOPIC, Session.TurnCompleted.TOPIC])  # a turn's end
    poll(lambda: notifier.due_in is None, 10, "one notification for both")
    assert notifier.sent == sent + 1


def test_a_deferred_notification_goes_out_when_the_process_stops(process: Process) -> None:
    runtime = process.runtime
    assert runtime is not None
    notifier = runtime.sessions.recorder.notifier  # type: ignore[attr-defined]
    notifier.defer = 3600.0
    poll(lambda: notifier.due_in is None, 10, "earlier notifications to go out")
    sent = notifier.sent

    notifier.notify([Session.ToolCallStarted.TOPIC])
    assert notifier.due_in > 3000
    notifier.close()

    assert notifier.sent == sent + 1 and notifier.due_in is None
