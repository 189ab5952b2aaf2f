"""A request built from what finished turns said equals the one rebuilt from their events.

Sessions are written by the domain's own commands with every way a turn can
end (tool calls that succeed and fail, a failed turn, cancelled turns before
and after a reply, an abandoned one, a resolved unknown call), with context
summaries, and forked; at each save the request of a fresh process (from the
``said_turns`` table, what it lacks replayed) must equal ``request_at`` (the
turns replayed from their events) and the request of the writing process.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg import sql

from turnlog.application import said
from turnlog.application.forks import fork_session
from turnlog.application.sessions import Sessions
from turnlog.application.settings import Settings
from turnlog.application.store import database, said_turns
from turnlog.domain.session import Session
from turnlog.domain.turns import Effect
from turnlog.interface.bootstrap import open_sessions

WORKER = "w1"


def fresh(settings: Settings, db: Any) -> Sessions:
    return Sessions(env=database.library_env(db, settings, create_table=False))


def stored_rows(db: Any, settings: Settings, session_id: UUID) -> int:
    with psycopg.connect(db.conninfo) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.said_turns WHERE session_id = %s").format(
                sql.Identifier(settings.schema_name)
            ),
            (session_id,),
        ).fetchone()
    return int(row[0]) if row else 0


def tool_turn(s: Session, n: int, *, fail: bool = False) -> None:
    turn, _ = s.submit_turn(f"turn {n}: use the tool")
    tid = turn.turn_id
    claim = s.claim_turn(tid, WORKER)
    call = {"call_id": f"c{n}", "name": "echo", "arguments": {"text": f"t{n}", "n": [n, 1.5]}}
    s.record_model_reply(tid, claim, f"calling for {n}", [call])
    attempt = s.start_tool_call(tid, claim, f"c{n}", WORKER, Effect.READ_ONLY)
    if fail:
        s.record_tool_failed(tid, claim, f"c{n}", attempt, "exit 1: ünïcode")
    else:
        s.record_tool_succeeded(tid, claim, f"c{n}", attempt, {"text": f"t{n}"})
    s.record_model_reply(tid, claim, f"done {n}", [])
    s.complete_turn(tid, claim, f"done {n}")


def failed_call_turn(s: Session, n: int) -> None:
    tool_turn(s, n, fail=True)


def odd_turns(s: Session, n: int) -> None:
    """A failed turn, a follow-up cancelled while queued, one cancelled after a reply."""
    turn, _ = s.submit_turn(f"turn {n}: fails")
    s.fail_turn(turn.turn_id, s.claim_turn(turn.turn_id, WORKER), "provider error: boom")
    first, _ = s.submit_turn(f"turn {n}: slow")
    claim = s.claim_turn(first.turn_id, WORKER)
    queued, _ = s.submit_turn(f"turn {n}: never mind", enqueue=True)
    s.cancel_turn(queued.turn_id, "not needed", "ops")
    call = {"call_id": f"x{n}", "name": "echo", "arguments": {}}
    s.record_model_reply(first.turn_id, claim, "", [call])
    s.cancel_turn(first.turn_id, "stop", "ops")
    s.finish_cancel(first.turn_id, datetime.now(UTC), claim)
    gone, _ = s.submit_turn(f"turn {n}: cancelled at once")
    s.cancel_turn(gone.turn_id, "changed my mind", "ops")


def unknown_turns(s: Session, n: int) -> None:
    """A turn abandoned with an unknown call, and one whose unknown call is resolved."""
    for k, settle in enumerate(("abandon", "resolve")):
        turn, _ = s.submit_turn(f"turn {n}.{k}: write it")
        tid, cid = turn.turn_id, f"u{n}.{k}"
        claim = s.claim_turn(tid, WORKER)
        call = {"call_id": cid, "name": "append_file", "arguments": {"path": "a.txt"}}
        s.record_model_reply(tid, claim, "", [call])
        s.start_tool_call(tid, claim, cid, WORKER, Effect.SIDE_EFFECTING)
        s.interrupt_turn(tid, previous_worker=WORKER)
        if settle == "abandon":
            s.abandon_turn(tid, "cannot tell", "ops")
            continue
        s.resolve_tool_call(cid, "succeeded", {"written": True}, "checked the file", "ops")
        claim = s.claim_turn(tid, WORKER)
        s.record_model_reply(tid, claim, "written", [])
        s.complete_turn(tid, claim, "written")


def compact(s: Session, n: int) -> None:
    turn, _ = s.submit_turn(f"turn {n}: after a summary")
    claim = s.claim_turn(turn.turn_id, WORKER)
    cover = max(len(s.finished) - 2, 1)
    produced_by = {"provider": "fixture", "model": "fixture-1", "usage": {}}
    s.compact_context(turn.turn_id, claim, f"summary of {cover}", cover, produced_by)
    s.record_model_reply(turn.turn_id, claim, f"reply {n}", [])
    s.complete_turn(turn.turn_id, claim, f"reply {n}")


def check(app: Sessions, settings: Settings, db: Any, session_id: UUID) -> Any:
    """The three builds agree; returns the request."""
    session = app.get_session(session_id)
    replayed = app.request_at(session_id, session.version)
    assert app.request_for(session) == replayed
    other = fresh(settings, db)
    try:
        assert other.request_for(other.get_session(session_id)) == replayed
    finally:
        other.close()
    return replayed


@pytest.fixture
def app(settings: Settings, database: Any) -> Any:
    sessions = open_sessions(settings, database)
    yield sessions
    sessions.close()


def test_requests_from_said_turns_equal_those_replayed_from_events(
    app: Sessions, settings: Settings, database: Any
) -> None:
    s = Session.start(title="all kinds", system_prompt="Be brief.", tools=["echo"])
    sid = s.id
    steps = [tool_turn, failed_call_turn, odd_turns, unknown_turns, compact]
    for n in range(10):
        steps[n % len(steps)](s, n)
        app.save(s)
        request = check(app, settings, database, sid)
        s = app.get_session(sid)
    roles = [m.role for m in request.messages]
    assert roles.count("tool") >= 2 and roles[1] == "system"  # the summary
    assert "never mind" not in str(request.messages)

    source = app.get_session(sid)
    fork = fork_session(app, sid, source.version).session_id
    assert check(app, settings, database, fork) == app.request_at(sid, source.version)
    f = app.get_session(fork)
    for n, step in enumerate((tool_turn, odd_turns, compact, tool_turn), start=10):
        step(f, n)
        app.save(f)
        check(app, settings, database, fork)
        f = app.get_session(fork)
    assert stored_rows(database, settings, fork) > 0


def test_a_cold_process_replays_no_finished_turn_once_they_are_stored(
    app: Sessions, settings: Settings, database: Any
) -> None:
    s = Session.start(title="long", tools=["echo"])
    for n in range(said.WRITE_EVERY + 3):
        tool_turn(s, n)
    app.save(s)
    expected = check(app, settings, database, s.id)  # a cold process stored them all
    assert stored_rows(database, settings, s.id) == said.WRITE_EVERY + 3

    other = fresh(settings, database)
    replayed: list[tuple[int, int]] = []
    replay_range = other.replay_range

    def counting(session_id: UUID, first: int, last: int) -> Session:
        replayed.append((first, last))
        return replay_range(session_id, first, last)

    other.replay_range = counting  # type: ignore[method-assign]
    try:
        assert other.request_for(other.get_session(s.id)) == expected
    finally:
        other.close()
    assert replayed == []


def test_a_row_that_does_not_fit_its_turn_is_rebuilt_and_a_missing_table_is_a_miss(
    app: Sessions, settings: Settings, database: Any
) -> None:
    s = Session.start(title="stale", tools=["echo"])
    for n in range(3):
        tool_turn(s, n)
    app.save(s)
    expected = check(app, settings, database, s.id)
    table = sql.SQL("{}.said_turns").format(sql.Identifier(settings.schema_name))
    wrong = "json_build_array(turn_id, first_version, ordinal, last_version - 1, '[]'::json)"
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("UPDATE {} SET said = " + wrong + "::text").format(table))
    check(app, settings, database, s.id)  # rebuilt, and the rows written again
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        saved = conn.execute(sql.SQL("SELECT said FROM {}").format(table)).fetchall()
    assert saved and all(json.loads(row[0])[4] for row in saved)
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE {}").format(table))  # a namespace made before it
    assert check(app, settings, database, s.id) == expected


@pytest.mark.parametrize(
    "said",
    [
        "'not json'",  # not JSON at all
        "'[1, 2]'",  # a row of the wrong length
        "json_build_array(turn_id, first_version, ordinal, last_version, '[[\"user\"]]'::json)",
        "json_build_array(turn_id, first_version, ordinal, last_version,"
        ' \'[["user", "x", [], "", "", 6, 7]]\'::json)',
        "json_build_array(turn_id, first_version, ordinal, last_version, '[\"user\"]'::json)",
    ],
    ids=["not-json", "short-row", "one-field-message", "seven-field-message", "text-message"],
)
def test_rows_that_do_not_decode_are_rendered_from_the_events_and_written_again(
    app: Sessions,
    settings: Settings,
    database: Any,
    said: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = Session.start(title="hand-written rows", tools=["echo"])
    for n in range(3):
        tool_turn(s, n)
    app.save(s)
    expected = check(app, settings, database, s.id)  # the rows are stored
    table = sql.SQL("{}.said_turns").format(sql.Identifier(settings.schema_name))
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("UPDATE {} SET said = " + said + "::text").format(table))
    with caplog.at_level("WARNING", logger="turnlog.sessions"):
        assert check(app, settings, database, s.id) == expected
    assert any("do not decode" in r.getMessage() for r in caplog.records)
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        saved = conn.execute(sql.SQL("SELECT said FROM {}").format(table)).fetchall()
    assert len(saved) == 3 and all(json.loads(row[0])[4] for row in saved)  # written again


def test_a_process_running_turns_reads_the_table_once_and_writes_in_batches(
    app: Sessions, settings: Settings, database: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    for name in ("read", "write"):
        real = getattr(said_turns, name)

        def spy(*args: Any, _real: Any = real, _name: str = name) -> Any:
            calls.append(_name)
            return _real(*args)

        monkeypatch.setattr(said_turns, name, spy)
    s = Session.start(title="live", tools=["echo"])
    tool_turn(s, 0)
    app.save(s)
    for n in range(1, said.WRITE_EVERY + 2):
        s = app.get_session(s.id)
        assert app.request_for(s) == app.request_at(s.id, s.version)
        tool_turn(s, n)
        app.save(s)
    assert calls == ["read", "write", "write"]  # the first request, then one batch
    assert stored_rows(database, settings, s.id) == said.WRITE_EVERY + 1
