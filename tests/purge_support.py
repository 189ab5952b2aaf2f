"""Looking for what a purge must leave nowhere: every table of a namespace, every column.

Each table of the namespace's schema is read whole: every row as JSON text
(``row_to_json``: text, JSON, UUIDs, arrays, timestamps), and every bytea
column's bytes decoded as UTF-8, so a session's text inside an event's stored
payload is found too. Nothing is listed by hand: a table added later is read
as well.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql

from turnlog.application.settings import schema_name
from turnlog.application.store.database import Database


def tables(conn: psycopg.Connection[Any], schema: str) -> list[str]:
    rows = conn.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s"
        " AND table_type = 'BASE TABLE' ORDER BY table_name",
        (schema,),
    ).fetchall()
    return [str(r[0]) for r in rows]


def _bytea_columns(conn: psycopg.Connection[Any], schema: str, table: str) -> list[str]:
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = %s"
        " AND table_name = %s AND data_type = 'bytea'",
        (schema, table),
    ).fetchall()
    return [str(r[0]) for r in rows]


def texts_of_table(conn: psycopg.Connection[Any], schema: str, table: str) -> Iterable[str]:
    """Every row of the table as text, and every bytea value decoded."""
    qualified = sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(table))
    for (text,) in conn.execute(sql.SQL("SELECT row_to_json(t)::text FROM {} t").format(qualified)):
        yield str(text)
    for column in _bytea_columns(conn, schema, table):
        statement = sql.SQL("SELECT {} FROM {} WHERE {} IS NOT NULL").format(
            sql.Identifier(column), qualified, sql.Identifier(column)
        )
        for (value,) in conn.execute(statement):
            yield bytes(value).decode("utf-8", errors="replace")


def needles_of(session_id: str | UUID, *texts: str) -> list[str]:
    """What must not be found: the id (with and without dashes) and the session's texts."""
    sid = UUID(str(session_id))
    return [str(sid), sid.hex, *texts]


def traces(
    database: Database, namespace: str, needles: list[str], skip: Iterable[str] = ()
) -> dict[str, list[str]]:
    """Per table (all but ``skip``), the needles found in it."""
    schema = schema_name(namespace)
    found: dict[str, list[str]] = {}
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        for table in tables(conn, schema):
            if table in skip:
                continue
            hits = set()
            for text in texts_of_table(conn, schema, table):
                hits.update(n for n in needles if n in text)
            if hits:
                found[table] = sorted(hits)
    return found


def purge_record(database: Database, namespace: str, session_id: str) -> dict[str, Any] | None:
    """The session's row of the namespace's purge table, as stored."""
    statement = sql.SQL("SELECT row_to_json(p) FROM {}.purges p WHERE session_id = %s").format(
        sql.Identifier(schema_name(namespace))
    )
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        row = conn.execute(statement, (session_id,)).fetchone()
    return None if row is None else dict(row[0])
