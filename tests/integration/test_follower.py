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
