"""A session's stored events as they are in the log: position, version, type, payload.

The library has no query for one aggregate's events *with* their global
positions, so this reads the events table directly (through the Sessions
application's own pool) and decodes each row through the application's
mapper, so compression or encryption configured there is honoured.

A session's events are read by version. That order is already a commit
order, so these reads need no commit horizon: version v + 1 can only be
inserted by a writer that has read version v, committed (the primary key
(session, version) makes a second writer of v wait for the first, then
fail), so no version can appear below one a reader has seen. Readers of the
*whole* log (``count_topics``, ``scan_topics``, the read models) follow the
horizon instead (``application.store.logorder``; docs/log-order.md).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from eventsourcing.persistence import StoredEvent
from psycopg import sql

from turnlog.application.sessions import Sessions
from turnlog.application.store import logorder
from turnlog.application.store.logorder import Place
from turnlog.domain.session import Session

# Fields every event carries that are shown as columns, not as payload.
_ENVELOPE = frozenset({"originator_id", "originator_version", "timestamp", "originator_topic"})


@dataclass(frozen=True)
class RecordedEvent:
    """One stored event of a session, decoded."""

    position: int
    version: int
    type: str
    topic: str
    timestamp: datetime
    payload: dict[str, Any]


class History:
    """Reads a session's events straight from the events table."""

    def __init__(self, sessions: Sessions) -> None:
        self._sessions = sessions
        recorder: Any = sessions.recorder
        self._datastore = recorder.datastore
        table = sql.SQL("{}.{}").format(
            sql.Identifier(self._datastore.schema), sql.Identifier(recorder.events_table_name)
        )
        self._page = sql.SQL(
            "SELECT notification_id, originator_version, topic, state FROM {} "
            "WHERE originator_id = %s AND originator_version > %s "
            "ORDER BY originator_version LIMIT %s"
        ).format(table)
        self._exists = sql.SQL(
            "SELECT 1 FROM {} WHERE originator_id = %s AND originator_version = 1"
        ).format(table)
        self._submissions = sql.SQL(
            "SELECT notification_id, originator_version, topic, state FROM {} "
            "WHERE originator_id = %s AND topic = %s ORDER BY originator_version DESC"
        ).format(table)
        self._head = sql.SQL("SELECT coalesce(max(notification_id), 0) AS head FROM {}").format(
            table
        )
        self._last_version = sql.SQL(
            "SELECT max(originator_version) AS v FROM {} WHERE originator_id = %s"
        ).format(table)
        # One index probe per session (max of the primary key's second column).
        self._last_versions = sql.SQL(
            "SELECT ids.id, (SELECT max(originator_version) FROM {} WHERE originator_id = ids.id)"
            " AS v FROM unnest(%s::uuid[]) AS ids(id)"
        ).format(table)
        self._at_version = sql.SQL(
            "SELECT notification_id FROM {} WHERE originator_id = %s AND originator_version = %s"
        ).format(table)

    def head(self) -> int:
        """The log's last position (0 for an empty log)."""
        with self._datastore.transaction(commit=False) as curs:
            curs.execute(self._head)
            row = curs.fetchone()
        return int(row["head"]) if row else 0

    def events(self, session_id: UUID, after: int = 0, limit: int = 100) -> list[RecordedEvent]:
        """Up to ``limit`` events with a version greater than ``after``, in order."""
        with self._datastore.transaction(commit=False) as curs:
            curs.execute(self._page, (session_id, after, limit))
            rows = curs.fetchall()
        return [self._decode(session_id, row) for row in rows]

    def last_version(self, session_id: UUID) -> int | None:
        """The session's last stored version; None when the session has no events."""
        with self._datastore.transaction(commit=False) as curs:
            curs.execute(self._last_version, (session_id,))
            row = curs.fetchone()
        return int(row["v"]) if row and row["v"] is not None else None

    def last_versions(self, session_ids: list[UUID]) -> dict[UUID, int]:
        """The last stored version of each of ``session_ids`` that has events (one query)."""
        if not session_ids:
            return {}
        with self._datastore.transaction(commit=False) as curs:
            curs.execute(self._last_versions, (session_ids,))
            rows = curs.fetchall()
        return {UUID(str(row["id"])): int(row["v"]) for row in rows if row["v"] is not None}

    def exists(self, session_id: UUID) -> bool:
        with self._datastore.transaction(commit=False) as curs:
            curs.execute(self._exists, (session_id,))
            return curs.fetchone() is not None

    def position_at(self, session_id: UUID, version: int) -> int | None:
        """The log position of the session's event at ``version``."""
        with self._datastore.transaction(commit=False) as curs:
            curs.execute(self._at_version, (session_id, version))
            row = curs.fetchone()
        return int(row["notification_id"]) if row else None

    def submission_position(self, session_id: UUID, turn_id: str) -> int | None:
        """The log position of the TurnSubmitted event of ``turn_id``."""
        with self._datastore.transaction(commit=False) as curs:
            curs.execute(self._submissions, (session_id, Session.TurnSubmitted.TOPIC))
            rows = curs.fetchall()
        for row in rows:
            event = self._decode(session_id, row)
            if event.payload.get("turn_id") == turn_id:
                return event.position
        return None

    def _decode(self, session_id: UUID, row: Any) -> RecordedEvent:
        stored = StoredEvent(
            originator_id=session_id,
            originator_version=int(row["originator_version"]),
            topic=str(row["topic"]),
            state=bytes(row["state"]),
        )
        event: Any = self._sessions.mapper.to_domain_event(stored)
        fields = {k: v for k, v in vars(event).items() if k not in _ENVELOPE}
        return RecordedEvent(
            position=int(row["notification_id"]),
            version=stored.originator_version,
            type=event_type(stored.topic),
            topic=stored.topic,
            timestamp=event.timestamp,
            payload=json.loads(json.dumps(fields, default=_plain)),
        )


def _plain(value: Any) -> Any:
    """A value of an event's payload as JSON: a state dataclass (the turns and calls a
    fork carries) as its fields, anything else (timestamps) as its text."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return str(value)


def event_type(topic: str) -> str:
    """The name an event is shown by: the one in its stored topic, not its class's.

    ``turnlog.session.SessionStarted.v1`` → ``SessionStarted`` (the class is
    ``Session.Started``): renaming a class changes neither what is stored nor
    what the API and its event streams say.
    """
    parts = topic.split(".")
    return parts[-2] if len(parts) > 1 else topic


def count_topics(
    sessions: Sessions, after: Place | None, topics: list[str]
) -> tuple[dict[str, int], Place]:
    """How many events of each topic were stored past ``after``, and the place to go on from.

    In the log's order and below the commit horizon (``application.store.logorder``):
    the place returned is just below the horizon, so counting again from it
    counts every event exactly once, also one that committed late. Reads only
    the part of the log past ``after`` (the log-order index), so a caller
    that keeps the returned place pays for new events only. ``after=None``
    counts nothing and returns the place to start from.
    """
    recorder: Any = sessions.recorder
    datastore = recorder.datastore
    table = logorder.table(datastore.schema, recorder.events_table_name)
    with datastore.transaction(commit=False) as curs:
        # One snapshot for both statements: the horizon and the rows agree.
        curs.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        horizon = logorder.current_horizon(curs)
        counts: dict[str, int] = {}
        if after is not None:
            curs.execute(
                sql.SQL(
                    "SELECT topic, count(*) AS n FROM {} WHERE {} AND {} < %s::xid8"
                    " AND topic = ANY(%s) GROUP BY topic"
                ).format(table, logorder.PAST, logorder.XACT),
                (*after.params(), str(horizon), topics),
            )
            counts = {str(r["topic"]): int(r["n"]) for r in curs.fetchall()}
    return counts, max(after or Place.start(), Place.below(horizon))


@dataclass(frozen=True)
class Scan:
    """Events of some topics past a place: (place, session id, topic); where to go on from."""

    found: list[tuple[Place, UUID, str]]
    next: Place
    pending: bool  # committed events wait past the horizon (an older transaction runs)


def scan_topics(sessions: Sessions, after: Place, topics: list[str], limit: int = 1000) -> Scan:
    """Events of ``topics`` past ``after``, in the log's order, below the commit horizon."""
    recorder: Any = sessions.recorder
    datastore = recorder.datastore
    table = logorder.table(datastore.schema, recorder.events_table_name)
    statement = sql.SQL(
        "WITH h AS (SELECT {horizon} AS x)"
        " SELECT e.*, h.x::text AS horizon,"
        "  EXISTS (SELECT 1 FROM {t} WHERE {xact} >= h.x) AS pending"
        " FROM h LEFT JOIN LATERAL ("
        "  SELECT notification_id, originator_id, topic, {xact}::text AS xact FROM {t}"
        "  WHERE {past} AND {xact} < h.x AND topic = ANY(%s) ORDER BY {order} LIMIT %s) e ON true"
        " ORDER BY e.xact::xid8, e.notification_id"
    ).format(
        horizon=logorder.HORIZON,
        t=table,
        xact=logorder.XACT,
        past=logorder.PAST,
        order=logorder.LOG_ORDER,
    )
    with datastore.transaction(commit=False) as curs:
        rows = curs.execute(statement, (*after.params(), topics, limit)).fetchall()
    found = [
        (Place(int(r["xact"]), int(r["notification_id"])), r["originator_id"], str(r["topic"]))
        for r in rows
        if r["notification_id"] is not None
    ]
    horizon = int(rows[0]["horizon"]) if rows else 0
    pending = bool(rows[0]["pending"]) if rows else False
    if found and len(found) == limit:
        return Scan(found, found[-1][0], pending)
    return Scan(found, max(after, Place.below(horizon)), pending)
