"""Positions and versions a client passes back: one that this log never handed out is a 422.

``?min_position`` (a write's position), ``after`` and ``Last-Event-ID`` (a
session's version), and ``audit --log --after`` (a position): malformed,
past the end, from another namespace, or naming no event here → a clear
4xx at once, never a wait that cannot end or a stream that skips.
"""

from __future__ import annotations

import time
from uuid import UUID

import psycopg
from fastapi.testclient import TestClient
from psycopg import sql

from tests.api.conftest import new_session, problem
from tests.conftest import turnlog
from tests.deadlines import poll, scaled
from turnlog.application.errors import InvalidPosition
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database
from turnlog.projections.audit import log_page
from turnlog.projections.log import EventLog

SSE = {"Accept": "text/event-stream"}


def rolled_back_position(database: Database, settings: Settings) -> int:
    """A position taken by an insert that rolled back: below the head, naming no event."""
    with psycopg.connect(database.conninfo) as conn:
        row = conn.execute(
            sql.SQL("SELECT nextval(pg_get_serial_sequence({}, 'notification_id'))").format(
                sql.Literal(f"{settings.schema_name}.sessions_events")
            )
        ).fetchone()
        conn.rollback()  # a sequence value is never given back: a permanent gap
    assert row is not None
    return int(row[0])


def test_min_position_that_names_no_event_here_is_422_at_once(
    api: TestClient, runtime: Runtime, database: Database, settings: Settings
) -> None:
    new_session(api)
    gap = rolled_back_position(database, settings)
    head = api.post("/v1/sessions", json={}).json()["position"]
    assert gap < head
    for bad, says in (
        (head + 1000, "past the end"),  # a future one, or another namespace's longer log
        (gap, "not the position of an event"),  # another namespace's, or a rolled-back insert
    ):
        started = time.monotonic()
        body = problem(api.get(f"/v1/sessions?min_position={bad}"), 422, "validation_error")
        assert says in body["detail"], body
        assert time.monotonic() - started < scaled(2.0)  # refused, not waited for
    for malformed in ("abc", "-1", "1.5", str(2**63)):
        problem(api.get(f"/v1/sessions?min_position={malformed}"), 422, "validation_error")


def test_after_or_last_event_id_past_the_session_is_422_not_a_stream_that_waits(
    api: TestClient,
) -> None:
    sid = new_session(api)
    api.post(f"/v1/sessions/{sid}/turns", json={"message": "hi"})  # version 2
    assert api.get(f"/v1/sessions/{sid}/events?after=2").json()["events"] == []
    body = problem(api.get(f"/v1/sessions/{sid}/events?after=3"), 422, "validation_error")
    assert "past the session's last version (2)" in body["detail"]
    problem(api.get(f"/v1/sessions/{sid}/events?after=3", headers=SSE), 422, "validation_error")
    for bad in ("3", "999999", "-1", "abc", str(2**63)):
        problem(
            api.get(f"/v1/sessions/{sid}/events", headers={**SSE, "Last-Event-ID": bad}),
            422,
            "validation_error",
        )
    # A version of another session is judged against this one (here: past its end).
    other = new_session(api)
    for _ in range(3):
        api.post(f"/v1/sessions/{other}/turns", json={"message": "more"})
    problem(api.get(f"/v1/sessions/{sid}/events?after=4"), 422, "validation_error")


def test_the_log_pager_refuses_a_position_that_names_no_event(
    runtime: Runtime, database: Database, settings: Settings
) -> None:
    runtime.sessions.create_session(title="one")
    gap = rolled_back_position(database, settings)
    last = runtime.sessions.create_session(title="two").position or 0
    events = EventLog(runtime.sessions)
    # Other tests' transactions in the same server may hold the commit horizon back a moment:
    # the pager waits for it (never skips), so poll until the head is readable.
    poll(lambda: [r.position for r in log_page(events, 0)][-1:] == [last], 30, "the log's head")
    for bad in (gap, last + 50, -1):
        try:
            log_page(events, bad)
        except InvalidPosition:
            continue
        raise AssertionError(f"position {bad} was accepted")
    done = turnlog(settings, "audit", "--log", "--after", str(gap))
    assert done.returncode != 0 and "not the position of an event" in done.stderr + done.stdout
    done = turnlog(settings, "audit", "--log", "--after", str(last + 50))
    assert done.returncode != 0 and "past the end" in done.stderr + done.stdout
    assert UUID(str(runtime.sessions.session_ids()[0]))
