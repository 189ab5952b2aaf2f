"""One ear per process: one follower reads each commit from the log once and tells every part."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from uuid import uuid4

import psycopg
import pytest
from psycopg import sql

from tests.deadlines import poll, scaled
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.application.store.follower import LogFollower
from turnlog.application.store.recorder import Hint, notice_of, payload_of
from turnlog.application.store.topics import ENDING_MARK, WORK_MARK
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
    assert listeners == [listeners[0]] and listeners[0].startswith("application/store/follower.py")


def test_a_wake_up_by_this_process_s_own_writes_waits_for_more_and_another_s_does_not(
    process: Process,
) -> None:
    follower, runtime = process.follower, process.runtime
    assert follower is not None and runtime is not None
    poll(lambda: follower.listening, 10, "the follower to listen")

    gathered, hinted = follower.gathered, follower.hinted
    runtime.sessions.create_session(title="ours")  # its NOTIFY names our notifier
    poll(lambda: follower.gathered > gathered, scaled(10), "a wake-up by our write to wait")
    assert follower.hinted == hinted  # our own: the save told this process already

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


def _hints_until(
    conn: psycopg.Connection[Any], seen: list[Hint], wanted: Callable[[list[Hint]], bool]
) -> None:
    """Read ``conn``'s notifications into ``seen`` until their hints satisfy ``wanted``."""

    def arrived() -> bool:
        for notification in conn.notifies(timeout=0.2):
            notice = notice_of(notification.payload)
            seen.extend(notice.hints if notice is not None else [])
        return wanted(seen)

    poll(arrived, scaled(10), "the hints")


def test_a_save_s_notification_names_the_work_and_the_turn_ends_it_holds(
    process: Process,
) -> None:
    runtime, follower = process.runtime, process.follower
    assert runtime is not None and follower is not None
    sid = runtime.sessions.create_session(title="hinted").session_id
    with psycopg.connect(runtime.db.conninfo, autocommit=True) as other:
        other.execute(sql.SQL("LISTEN {}").format(sql.Identifier(follower.channel)))

        submitted = runtime.sessions.submit_turn(sid, "hello")  # this process's worker runs it

        seen: list[Hint] = []
        work = Hint(sid, WORK_MARK, submitted.version)
        _hints_until(other, seen, lambda hints: work in hints)
        _hints_until(
            other,
            seen,
            lambda hints: any(h.session_id == sid and ENDING_MARK in h.marks for h in hints),
        )
    turn = runtime.sessions.turn_record(sid, submitted.turn_id)[1]
    assert turn.state == "completed"


def _notify(conn: psycopg.Connection[Any], channel: str, payload: str) -> None:
    conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))


@contextmanager
def _listening(
    runtime: Runtime, prompt: Callable[[], bool] | bool
) -> Iterator[tuple[LogFollower, list[Hint]]]:
    """A follower of its own (polling hourly), its one page subscriber, and the hints told."""
    follower = LogFollower(runtime.sessions, runtime.db, poll_interval=3600)
    told: list[Hint] = []
    follower.subscribe(lambda page: None, prompt=prompt)
    follower.subscribe_hints(told.extend)
    follower.start()
    try:
        poll(lambda: follower.listening, scaled(10), "the follower to listen")
        yield follower, told
    finally:
        follower.stop()


def test_another_process_s_hints_are_handed_over_before_the_log_is_read(
    runtime: Runtime,
) -> None:
    hurry = [False]
    asked = [0]

    def in_a_hurry() -> bool:
        asked[0] += 1
        return hurry[0]

    with (
        _listening(runtime, in_a_hurry) as (follower, told),
        psycopg.connect(runtime.db.conninfo, autocommit=True) as other,
    ):
        reads = follower.reads
        hint = Hint(uuid4(), WORK_MARK, 3)
        _notify(other, follower.channel, payload_of("feedfacefeedface", [hint]))
        poll(lambda: told == [hint], scaled(10), "the hint to be handed over")
        # No subscriber is in a hurry: the follower keeps gathering (it asks
        # again every GATHER) and reads nothing before its poll.
        since = asked[0]
        poll(lambda: asked[0] >= since + 3, scaled(10), "the follower to ask again")
        assert follower.reads == reads
        assert follower.hinted == 1 and follower.gathered >= 1

        hurry[0] = True  # a subscriber needs the pages now: read at once
        poll(lambda: follower.reads > reads, scaled(10), "the read")


def test_a_notification_whose_hints_cannot_be_read_is_read_from_the_log_at_once(
    runtime: Runtime,
) -> None:
    with (
        _listening(runtime, False) as (follower, told),
        psycopg.connect(runtime.db.conninfo, autocommit=True) as other,
    ):
        reads = follower.reads
        _notify(other, follower.channel, "1 feedfacefeedface not-a-session:w:1")
        poll(lambda: follower.reads > reads, scaled(10), "the read")
        assert told == [] and follower.hinted == 0
