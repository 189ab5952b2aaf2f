"""Long sessions at flat cost: bounded state, pruned snapshots, old snapshots upcast.

The fixture ``tests/fixtures/old_shape_session.json`` holds the stored rows
(events and version-1 snapshots) of a 30-turn session exactly as turnlog wrote
them before a session's state was bounded: every snapshot a full copy of
every turn. The migration test inserts those rows and continues the session.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql

from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.domain.turns import TurnState
from turnlog.interface.bootstrap import build_runtime

FIXTURE = Path(__file__).parent.parent / "fixtures" / "old_shape_session.json"


def _rows(database: Any, schema: str, table: str, session_id: UUID) -> list[tuple[Any, ...]]:
    with psycopg.connect(database.conninfo) as conn:
        return conn.execute(
            sql.SQL(
                "SELECT originator_version, topic, state FROM {}.{}"
                " WHERE originator_id = %s ORDER BY originator_version"
            ).format(sql.Identifier(schema), sql.Identifier(table)),
            (session_id,),
        ).fetchall()


def _insert_fixture(database: Any, schema: str) -> tuple[UUID, dict[str, Any]]:
    data = json.loads(FIXTURE.read_text())
    session_id = UUID(data["session_id"])
    with psycopg.connect(database.conninfo) as conn:
        for table in ("sessions_events", "sessions_snapshots"):
            for version, topic, state in data[table]:
                conn.execute(
                    sql.SQL(
                        "INSERT INTO {}.{} (originator_id, originator_version, topic, state)"
                        " VALUES (%s, %s, %s, %s)"
                    ).format(sql.Identifier(schema), sql.Identifier(table)),
                    (session_id, version, topic, base64.b64decode(state)),
                )
    return session_id, data


def test_a_long_session_written_in_the_old_shape_loads_and_continues(
    settings: Settings, database: object
) -> None:
    rt = build_runtime(settings.model_copy(update={"snapshot_interval": 40}))
    try:
        session_id, data = _insert_fixture(database, settings.schema_name)
        assert {r[1] for r in data["sessions_snapshots"]} == {"turnlog.session.Snapshot.v1"}

        session = rt.sessions.get_session(session_id)  # from the version-1 snapshot at 121

        record = rt.sessions.get_record(session_id)
        assert session.turn_count == 30 and session.turns == [] and session.calls == {}
        assert session.counts == {"completed": 30}
        # The upcast state, with ranges read back from the stream, equals a replay.
        assert session.finished == record.finished
        assert all(e[2] and e[3] >= e[2] for e in session.finished)
        # Idempotency survives the upcast: same key and message is the same turn.
        repeat = rt.sessions.submit_turn(session_id, "message 10", idempotency_key="key-10")
        assert not repeat.created and repeat.position is None

        sent = rt.send(session_id, "What is the codeword?")
        assert sent.turn.reply == "The codeword is heron."
        for i in range(50):
            assert rt.send(session_id, f"more {i}").turn.state == "completed"
        assert rt.send(session_id, "What is the codeword?").turn.reply == "The codeword is heron."
    finally:
        rt.close()

    snapshots = _rows(database, settings.schema_name, "sessions_snapshots", session_id)
    assert len(snapshots) == 2
    assert {r[1] for r in snapshots} == {"turnlog.session.Snapshot.v2"}
    # The stored events are never rewritten: the old rows are there, byte for byte.
    events = _rows(database, settings.schema_name, "sessions_events", session_id)
    old = [(v, t, base64.b64decode(s)) for v, t, s in data["sessions_events"]]
    assert [(v, t, bytes(s)) for v, t, s in events[: len(old)]] == old


def test_snapshot_rows_of_a_session_never_exceed_the_keep_count(
    settings: Settings, database: object
) -> None:
    rt = build_runtime(settings.model_copy(update={"snapshot_interval": 3}))
    try:
        session_id = rt.sessions.create_session(tools=["echo"]).session_id
        most = 0
        for i in range(25):
            message = '/tool echo {"text": "x"}' if i % 2 else f"hello {i}"
            assert rt.send(session_id, message).turn.state == "completed"
            rows = _rows(database, settings.schema_name, "sessions_snapshots", session_id)
            most = max(most, len(rows))
        assert most == rt.sessions.snapshot_keep == 2
    finally:
        rt.close()


def test_a_session_keeps_only_a_summary_of_its_finished_turns(runtime: Runtime) -> None:
    session_id = runtime.sessions.create_session(tools=["echo"]).session_id
    runtime.send(session_id, "The codeword is wren")
    tool = runtime.send(session_id, '/tool echo {"text": "x"}').turn

    session = runtime.sessions.get_session(session_id)
    assert session.turns == [] and session.calls == {}
    assert [(e[1], e[2], e[3]) for e in session.finished] == [
        ("completed", 2, 5),
        ("completed", 6, session.version),
    ]
    # A finished turn is read back in full from its own version range.
    record, turn = runtime.sessions.turn_record(session_id, tool.turn_id)
    assert turn.state is TurnState.COMPLETED and turn.message == '/tool echo {"text": "x"}'
    assert [c.result for c in record.calls_of(turn)] == [{"text": "x"}]
    assert runtime.send(session_id, "What is the codeword?").turn.reply == "The codeword is wren."
