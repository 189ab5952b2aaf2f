"""The table of what finished turns said: the messages each adds to later requests.

A finished turn never changes, so the messages it contributes to every later
request of its session are rendered once and kept here, one row per turn:
its id, where its events are (``first_version``, ``last_version``), its place
among the turns that share a first version (the turns a fork inherits all sit
at version 1) and ``said``: the JSON array [turn id, first version, ordinal,
last version, messages] (the messages as ``domain.request.messages_to_json``
writes them). A request reads the rows of its window in one statement, as one
JSON text, instead of replaying the turns' events.

The rows are derived data: any one missing is rebuilt from the events (and
written again), so their commit does not wait for the disk (``chain.RIDING``:
a crash of the database may lose the last rows written), a row whose last
version is not the turn's is not used, nor are rows that do not decode
(``application.said``), and a
purge drops them with the session's other rows (the table has a
``session_id`` column). A write holds a key-share lock on the session's latest
event, so it cannot slip in after a purge has deleted the session's rows.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from eventsourcing.utils import strtobool
from psycopg import sql

from turnlog.application.store import logorder
from turnlog.application.store.arrays import Integers, Texts
from turnlog.application.store.chain import RIDING

TABLE = "said_turns"
UNDEFINED_TABLE = "42P01"


# One stored turn as it decodes: [turn id, first version, ordinal, last version, messages].
SaidRow = list[Any]


def table(schema: str) -> sql.Composed:
    return logorder.table(schema, TABLE)


def create_statement(schema: str) -> sql.Composed:
    return sql.SQL(
        "CREATE TABLE IF NOT EXISTS {} (session_id uuid NOT NULL, turn_id text NOT NULL,"
        " first_version bigint NOT NULL, ordinal integer NOT NULL,"
        " last_version bigint NOT NULL, said text NOT NULL,"
        " PRIMARY KEY (session_id, turn_id))"
    ).format(table(schema))


def create_table(app: Any) -> None:
    """Create the table if missing, when the application creates its tables (CREATE_TABLE)."""
    recorder = app.recorder
    if getattr(recorder, "datastore", None) is None or not strtobool(
        app.env.get("CREATE_TABLE") or "yes"
    ):
        return
    with recorder.datastore.transaction(commit=True) as curs:
        curs.execute(create_statement(recorder.datastore.schema))


def read(recorder: Any, session_id: UUID, first: int, last: int) -> list[SaidRow]:
    """The stored turns whose events lie in versions ``first..last``, in request order.

    One row comes back (the turns aggregated into one JSON text), so the
    cost is one decode however many turns there are. A namespace without the
    table has none.
    """
    statement = sql.SQL(
        "SELECT '[' || string_agg(said, ',' ORDER BY first_version, ordinal) || ']' AS said"
        " FROM {} WHERE session_id = %s AND first_version >= %s AND last_version <= %s"
    ).format(table(recorder.datastore.schema))
    try:
        with recorder.datastore.get_connection() as conn:  # one statement: no BEGIN/COMMIT
            row = conn.execute(statement, (session_id, first, last)).fetchone()
    except Exception as exc:
        if _undefined_table(exc):
            return []
        raise
    if row is None or row["said"] is None:
        return []
    rows: list[SaidRow] = json.loads(row["said"])  # lists in SaidRow's order
    return rows


def write(
    recorder: Any, session_id: UUID, latest_version: int, rows: Sequence[tuple[Any, ...]]
) -> int:
    """Store turns (turn id, first version, ordinal, last version, messages' JSON).

    Written only while the session's event at ``latest_version`` exists
    (held with a key-share lock until the commit); a turn's row already
    stored is replaced. A namespace without the table stores nothing.
    Returns how many rows were written.
    """
    if not rows:
        return 0
    schema = recorder.datastore.schema
    events = sql.SQL("{}.{}").format(
        sql.Identifier(schema), sql.Identifier(recorder.events_table_name)
    )
    statement = sql.SQL(
        "WITH held AS (SELECT 1 FROM {e} WHERE originator_id = %s AND originator_version = %s"
        " FOR KEY SHARE)"
        " INSERT INTO {t} (session_id, turn_id, first_version, ordinal, last_version, said)"
        " SELECT %s, r.* FROM unnest(%s::text[], %s::bigint[], %s::integer[], %s::bigint[],"
        " %s::text[]) AS r{riding} WHERE EXISTS (SELECT 1 FROM held)"
        " ON CONFLICT (session_id, turn_id) DO UPDATE SET first_version = excluded.first_version,"
        " ordinal = excluded.ordinal, last_version = excluded.last_version, said = excluded.said"
    ).format(e=events, t=table(schema), riding=RIDING)
    rows = [(*r[:4], _said(*r)) for r in rows]
    ids, firsts, ordinals, lasts, said = zip(*rows, strict=True)
    columns = [Texts(ids), Integers(firsts), Integers(ordinals), Integers(lasts), Texts(said)]
    try:
        with recorder.datastore.transaction(commit=True) as curs:
            curs.execute(statement, (session_id, latest_version, session_id, *columns))
            return int(curs.rowcount or 0)
    except Exception as exc:
        if _undefined_table(exc):
            return 0
        raise


def _said(turn_id: str, first: int, ordinal: int, last: int, messages: str) -> str:
    return f"[{json.dumps(turn_id)},{int(first)},{int(ordinal)},{int(last)},{messages}]"


def _undefined_table(exc: BaseException) -> bool:
    cause: BaseException | None = exc
    while cause is not None:
        if getattr(cause, "sqlstate", None) == UNDEFINED_TABLE:
            return True
        cause = cause.__cause__
    return False
