"""The statements the Sessions application runs on its own tables, beside the library's.

Each takes the application's recorder (the library's PostgreSQL recorder,
whose datastore knows the namespace's schema) and composes identifiers with
``psycopg.sql``.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from psycopg import sql

from turnlog.application.store.chain import RIDING


def _table(recorder: Any) -> sql.Composable:
    return sql.SQL("{}.{}").format(
        sql.Identifier(recorder.datastore.schema), sql.Identifier(recorder.events_table_name)
    )


def on_postgres(recorder: Any) -> bool:
    """Whether the recorder is PostgreSQL's (not the in-memory one of unit tests)."""
    return getattr(recorder, "datastore", None) is not None


def prune(recorder: Any, session_id: UUID, keep: int) -> int:
    """Delete a stream's rows of ``recorder``'s table but the latest ``keep``; returns how many.

    For a cache's rows (snapshots): the commit does not wait for the disk
    (``chain.RIDING``); lost in a crash, the rows are pruned at the next snapshot.
    """
    statement = sql.SQL(
        "DELETE FROM {t} USING (SELECT 1) AS one{riding} WHERE originator_id = %s"
        " AND originator_version < ("
        " SELECT min(originator_version) FROM (SELECT originator_version FROM {t}"
        " WHERE originator_id = %s ORDER BY originator_version DESC LIMIT %s) AS kept)"
    ).format(t=_table(recorder), riding=RIDING)
    with recorder.datastore.transaction(commit=True) as curs:
        curs.execute(statement, (session_id, session_id, keep))
        return int(curs.rowcount or 0)


def latest_version(recorder: Any, session_id: UUID) -> int:
    """A stream's latest stored version (0: none): one index lookup, no events read."""
    statement = sql.SQL(
        "SELECT originator_version FROM {} WHERE originator_id = %s"
        " ORDER BY originator_version DESC LIMIT 1"
    ).format(_table(recorder))
    with recorder.datastore.get_connection() as conn:  # one statement: no BEGIN/COMMIT
        row = conn.execute(statement, (session_id,)).fetchone()
    return int(row["originator_version"]) if row else 0


def rows_of_topics(recorder: Any, session_id: UUID, topics: list[str]) -> list[Any]:
    """A stream's stored rows of these topics, in version order (version, topic, state)."""
    statement = sql.SQL(
        "SELECT originator_version, topic, state FROM {} WHERE originator_id = %s"
        " AND topic = ANY(%s) ORDER BY originator_version"
    ).format(_table(recorder))
    with recorder.datastore.transaction(commit=False) as curs:
        curs.execute(statement, (session_id, topics))
        return list(curs.fetchall())


def hash_at(recorder: Any, session_id: UUID, version: int) -> str:
    """The chained hash of a stream's event at ``version``, in hex ("" when unchained or none)."""
    if not on_postgres(recorder):
        return ""  # in-memory persistence (unit tests): no chain
    statement = sql.SQL(
        "SELECT encode(hash, 'hex') AS hash FROM {} WHERE originator_id = %s"
        " AND originator_version = %s"
    ).format(_table(recorder))
    with recorder.datastore.get_connection() as conn:
        row = conn.execute(statement, (session_id, version)).fetchone()
    return str(row["hash"]) if row and row["hash"] else ""
