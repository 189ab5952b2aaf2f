"""The purge record table, and the statements that drop one session's rows from the namespace.

A purge is the one place where stored events are deleted. What stays is a
row in ``purges`` (not event-sourced, like the workers registry): the
session id, who asked and why, when it began and ended, and what existed —
the number of events, the last version and its chained hash (the head of
the session's hash chain, ``application.store.chain``), and the highest
place in the log's order any of them had.

A row is written in three steps so that a purge killed at any point
finishes on the next try: ``begin`` (the intent: state ``purging``),
``drop_rows`` (the session's events, snapshots and every row of a table of
the namespace keyed by ``session_id``, with the counts, in ONE
transaction), then ``finish`` (state ``done``).

Every identifier is composed with ``psycopg.sql``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql

from turnlog.application.errors import SessionNotFound, SessionPurged
from turnlog.application.store import logorder

TABLE = "purges"
PURGING = "purging"
DONE = "done"
# Tables that are not a session's data even though they may name one.
KEPT_TABLES = frozenset({TABLE})


@dataclass(frozen=True)
class PurgeRecord:
    """One purge: who, why, when, and what existed (set once the rows are dropped)."""

    session_id: UUID
    state: str  # purging, done
    actor: str
    reason: str
    requested_at: datetime
    completed_at: datetime | None
    events: int | None  # None until the rows are dropped
    head_version: int | None
    head_hash: str | None  # hex; None for a stream stored before the chain
    last_position: int | None
    last_xact: int | None

    @property
    def done(self) -> bool:
        return self.state == DONE

    @property
    def dropped(self) -> bool:
        """The session's rows are gone (the record holds what existed)."""
        return self.events is not None

    def as_dict(self) -> dict[str, Any]:
        return {
            "session_id": str(self.session_id),
            "state": self.state,
            "actor": self.actor,
            "reason": self.reason,
            "requested_at": self.requested_at.isoformat(),
            "completed_at": self.completed_at.isoformat() if self.completed_at else None,
            "events": self.events,
            "head_version": self.head_version,
            "head_hash": self.head_hash,
            "last_position": self.last_position,
        }


def purged_error(record: PurgeRecord) -> SessionPurged:
    """The 410 a purged session answers with."""
    when = record.completed_at or record.requested_at
    return SessionPurged(
        f"session {record.session_id} was purged ({when:%Y-%m-%d %H:%M:%S %Z})",
        purged_at=when.isoformat(),
    )


def missing(recorder: Any, session_id: UUID) -> Exception:
    """For a session with no events: 410 when it was purged, else 404 (no purge table: 404).

    Asked only once the events are known to be missing, so a session that
    exists costs nothing.
    """
    datastore = getattr(recorder, "datastore", None)
    if datastore is not None:  # else in-memory persistence (unit tests)
        with datastore.get_connection() as conn:
            found = find(conn, datastore.schema, session_id)
        if found is not None:
            return purged_error(found)
    return SessionNotFound(f"session {session_id} not found")


_COLUMNS = (
    "session_id, state, actor, reason, requested_at, completed_at, events, head_version,"
    " encode(head_hash, 'hex') AS head_hash, last_position, last_xact::text AS last_xact"
)


def table(schema: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(TABLE))


def create_statement(schema: str) -> sql.Composed:
    return sql.SQL(
        "CREATE TABLE IF NOT EXISTS {} (session_id uuid PRIMARY KEY, state text NOT NULL,"
        " actor text NOT NULL, reason text NOT NULL,"
        " requested_at timestamptz NOT NULL DEFAULT now(), completed_at timestamptz,"
        " events bigint, head_version bigint, head_hash bytea, last_position bigint,"
        " last_xact xid8)"
    ).format(table(schema))


def _record(row: dict[str, Any]) -> PurgeRecord:
    def number(name: str) -> int | None:
        value = row[name]
        return None if value is None else int(value)

    return PurgeRecord(
        session_id=UUID(str(row["session_id"])),
        state=str(row["state"]),
        actor=str(row["actor"]),
        reason=str(row["reason"]),
        requested_at=row["requested_at"],
        completed_at=row["completed_at"],
        events=number("events"),
        head_version=number("head_version"),
        head_hash=row["head_hash"],
        last_position=number("last_position"),
        last_xact=number("last_xact"),
    )


def find(conn: psycopg.Connection[Any], schema: str, session_id: UUID) -> PurgeRecord | None:
    """The purge record of a session (None: never purged, or no purge table yet)."""
    statement = sql.SQL("SELECT {} FROM {} WHERE session_id = %s").format(
        sql.SQL(_COLUMNS), table(schema)
    )
    try:
        with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
            row = cur.execute(statement, (session_id,)).fetchone()
    except psycopg.errors.UndefinedTable:
        if not conn.autocommit:
            conn.rollback()
        return None
    return None if row is None else _record(row)


def finished_since(
    conn: psycopg.Connection[Any], schema: str, since: datetime | None
) -> tuple[list[UUID], datetime]:
    """Sessions whose purge finished after ``since`` (None: in the last minute), and the
    time to ask from next (the database's clock)."""
    statement = sql.SQL(
        "SELECT session_id, completed_at FROM {} WHERE completed_at > %s ORDER BY completed_at"
    ).format(table(schema))
    now = conn.execute("SELECT now()").fetchone()
    assert now is not None
    start = since or now[0] - timedelta(minutes=1)
    try:
        rows = conn.execute(statement, (start,)).fetchall()
    except psycopg.errors.UndefinedTable:
        if not conn.autocommit:
            conn.rollback()
        return [], start
    return [UUID(str(r[0])) for r in rows], (rows[-1][1] if rows else start)


def begin(
    conn: psycopg.Connection[Any], schema: str, session_id: UUID, actor: str, reason: str
) -> PurgeRecord:
    """Record the intent (state ``purging``), or return the record already there."""
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (session_id, state, actor, reason) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (session_id) DO NOTHING"
        ).format(table(schema)),
        (session_id, PURGING, actor, reason),
    )
    found = find(conn, schema, session_id)
    assert found is not None
    return found


def note_head(
    conn: psycopg.Connection[Any],
    schema: str,
    events_table: str,
    session_id: UUID,
    *,
    again: bool,
) -> None:
    """Note the stream's last version and hash: the head as it was when the purge was asked.

    Noted before the purge closes the session, so that it is the head anyone
    outside could have kept (``turnlog audit --head``), not the purge's own
    close. ``again``: note it even if noted already (the session is still open,
    so its last event is not the purge's).
    """
    conn.execute(
        sql.SQL(
            "UPDATE {p} SET head_version = h.v, head_hash = h.hash FROM (SELECT"
            " originator_version AS v, hash FROM {e} WHERE originator_id = %s"
            " ORDER BY originator_version DESC LIMIT 1) AS h"
            " WHERE {p}.session_id = %s AND {p}.events IS NULL AND ({p}.head_version IS NULL OR %s)"
        ).format(p=table(schema), e=logorder.table(schema, events_table)),
        (session_id, session_id, again),
    )


def session_tables(conn: psycopg.Connection[Any], schema: str) -> list[str]:
    """The namespace's tables with a ``session_id`` column (read models, and any later one)."""
    rows = conn.execute(
        "SELECT c.table_name FROM information_schema.columns c"
        " JOIN information_schema.tables t"
        "  ON t.table_schema = c.table_schema AND t.table_name = c.table_name"
        " WHERE c.table_schema = %s AND c.column_name = 'session_id'"
        "  AND t.table_type = 'BASE TABLE' ORDER BY c.table_name",
        (schema,),
    ).fetchall()
    return [str(r[0]) for r in rows if str(r[0]) not in KEPT_TABLES]


@dataclass(frozen=True)
class Dropped:
    """What ``drop_rows`` deleted."""

    events: int
    snapshots: int
    rows: dict[str, int]  # read-model (and other session-keyed) rows per table


def drop_rows(
    conn: psycopg.Connection[Any],
    schema: str,
    events_table: str,
    snapshots_table: str | None,
    session_id: UUID,
) -> Dropped:
    """In one transaction: note what existed in the record, then delete the session's rows.

    The record gets the number of events (the purge's own close included) and
    the highest position and transaction id of the session's events (and the
    head, unless ``note_head`` noted it before the close); then the
    events, the snapshots and every session-keyed row go. A record whose rows
    were dropped already keeps what it noted then (a repeat deletes what a
    late writer may have added, and notes nothing new).
    """
    events = logorder.table(schema, events_table)
    with conn.transaction():
        conn.execute(
            sql.SQL(
                "UPDATE {p} SET events = s.n, last_position = s.pos, last_xact = s.x,"
                " head_hash = CASE WHEN {p}.head_version IS NULL THEN s.h ELSE {p}.head_hash END,"
                " head_version = coalesce({p}.head_version, s.v)"
                " FROM (SELECT count(*) AS n, max(originator_version) AS v,"
                "  (SELECT hash FROM {e} WHERE originator_id = %s"
                "    ORDER BY originator_version DESC LIMIT 1) AS h,"
                "  max(notification_id) AS pos, max({xact}) AS x"
                "  FROM {e} WHERE originator_id = %s) AS s"
                " WHERE {p}.session_id = %s AND {p}.events IS NULL"
            ).format(p=table(schema), e=events, xact=logorder.XACT),
            (session_id, session_id, session_id),
        )
        dropped = _delete(conn, events, "originator_id", session_id)
        snapshots = 0
        if snapshots_table is not None:
            snapshots = _delete(
                conn, logorder.table(schema, snapshots_table), "originator_id", session_id
            )
        rows = {
            name: _delete(conn, logorder.table(schema, name), "session_id", session_id)
            for name in session_tables(conn, schema)
        }
    return Dropped(dropped, snapshots, rows)


def _delete(
    conn: psycopg.Connection[Any], qualified: sql.Composable, column: str, sid: UUID
) -> int:
    cur = conn.execute(
        sql.SQL("DELETE FROM {} WHERE {} = %s").format(qualified, sql.Identifier(column)), (sid,)
    )
    return int(cur.rowcount or 0)


def finish(conn: psycopg.Connection[Any], schema: str, session_id: UUID) -> PurgeRecord:
    """Mark the purge done (once); returns the record."""
    conn.execute(
        sql.SQL(
            "UPDATE {} SET state = %s, completed_at = coalesce(completed_at, now())"
            " WHERE session_id = %s"
        ).format(table(schema)),
        (DONE, session_id),
    )
    found = find(conn, schema, session_id)
    assert found is not None
    return found


def unfinished(conn: psycopg.Connection[Any], schema: str) -> Sequence[UUID]:
    """Sessions whose purge began and has not finished (a process died in it)."""
    try:
        rows = conn.execute(
            sql.SQL("SELECT session_id FROM {} WHERE state = %s ORDER BY requested_at").format(
                table(schema)
            ),
            (PURGING,),
        ).fetchall()
    except psycopg.errors.UndefinedTable:
        if not conn.autocommit:
            conn.rollback()
        return []
    return [UUID(str(r[0])) for r in rows]
