"""A namespace written before events recorded their transaction keeps working.

Its events table and tracking tables have no ``xact_id`` column. Opening it
adds the column (NULL for every stored event: nothing is rewritten), its
default and the index; old events read as transaction 0, in position order,
before every new one, and an old tracking row (a plain position) resumes
exactly where it was.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from turnlog.application.settings import Settings
from turnlog.application.store.database import Database
from turnlog.interface.bootstrap import build_runtime
from turnlog.projections import ProjectionSupervisor, ReadModels, read_models
from turnlog.projections.audit import log_page
from turnlog.projections.rebuild import verify


def as_written_by_older_code(database: Database, settings: Settings) -> None:
    """Drop what newer code adds: the column on the events and tracking tables, the index."""
    schema = sql.Identifier(settings.schema_name)
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        for table in ["sessions_events", *(m.tracking_table for m in read_models())]:
            conn.execute(
                sql.SQL("ALTER TABLE {}.{} DROP COLUMN xact_id").format(
                    schema, sql.Identifier(table)
                )
            )


def test_an_older_namespace_is_migrated_without_rewriting_events_and_readers_resume(
    settings: Settings, database: Database
) -> None:
    runtime = build_runtime(settings)
    try:
        old = [runtime.sessions.create_session(title=f"old {i}") for i in range(3)]
        with ProjectionSupervisor(settings, database, sessions=runtime.sessions, poll_interval=0.1):
            read = ReadModels(database, settings, sessions=runtime.sessions)
            assert read.wait_for(old[-1].position, timeout=30)
    finally:
        runtime.close()
    as_written_by_older_code(database, settings)
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        stored_before = conn.execute(
            sql.SQL("SELECT notification_id, state FROM {}.sessions_events ORDER BY 1").format(
                sql.Identifier(settings.schema_name)
            )
        ).fetchall()

    runtime = build_runtime(settings)  # migrates
    try:
        read = ReadModels(database, settings, sessions=runtime.sessions)
        # Old tracking rows stand for (0, position): nothing to redo, nothing skipped.
        assert read.positions() == {m.name: old[-1].position for m in read_models()}
        new = [runtime.sessions.create_session(title=f"new {i}") for i in range(3)]
        with ProjectionSupervisor(settings, database, sessions=runtime.sessions, poll_interval=0.1):
            assert read.wait_for(new[-1].position, timeout=30)
        assert all(r.ok for r in verify(read.events, read_models()))
        titles = sorted(row["title"] for row in read.list_sessions(limit=50)[0])
        assert titles == sorted([f"old {i}" for i in range(3)] + [f"new {i}" for i in range(3)])
        page = log_page(read.events, 0, limit=100)
        positions = [r.position for r in page]
        old_positions = [p for p, _ in stored_before]
        assert positions[: len(old_positions)] == old_positions  # old first, in order
        assert [r.xact for r in page[: len(old_positions)]] == [0] * len(old_positions)
        assert all(r.xact > 0 for r in page[len(old_positions) :])
        assert log_page(read.events, old_positions[-1], 100) == page[len(old_positions) :]
    finally:
        runtime.close()
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        stored_after = conn.execute(
            sql.SQL(
                "SELECT notification_id, state FROM {}.sessions_events"
                " WHERE xact_id IS NULL ORDER BY 1"
            ).format(sql.Identifier(settings.schema_name))
        ).fetchall()
    assert stored_after == stored_before  # the stored events, untouched
