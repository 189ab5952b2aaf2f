"""A session's stored events as they are in the log: position, version, type, payload.

The library has no query for one aggregate's events *with* their global
positions, so this reads the events table directly (through the Sessions
application's own pool) and decodes each row through the application's
mapper, so compression or encryption configured there is honoured.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from eventsourcing.persistence import StoredEvent
from psycopg import sql

from turnlog.application.sessions import Sessions
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
            type=type(event).__name__,
            topic=stored.topic,
            timestamp=event.timestamp,
            payload=json.loads(json.dumps(fields, default=str)),
        )


def count_topics(sessions: Sessions, after: int, topics: list[str]) -> tuple[dict[str, int], int]:
    """How many events of each topic were stored after position ``after``, and the last position.

    Reads only the part of the log past ``after`` (the notification-id index),
    so a caller that keeps the returned position pays for new events only.
    """
    recorder: Any = sessions.recorder
    datastore = recorder.datastore
    table = sql.SQL("{}.{}").format(
        sql.Identifier(datastore.schema), sql.Identifier(recorder.events_table_name)
    )
    with datastore.transaction(commit=False) as curs:
        curs.execute(
            sql.SQL("SELECT coalesce(max(notification_id), 0) AS last FROM {}").format(table)
        )
        row = curs.fetchone()
        last = int(row["last"]) if row else 0
        curs.execute(
            sql.SQL(
                "SELECT topic, count(*) AS n FROM {} WHERE notification_id > %s"
                " AND notification_id <= %s AND topic = ANY(%s) GROUP BY topic"
            ).format(table),
            (after, last, topics),
        )
        counts = {str(r["topic"]): int(r["n"]) for r in curs.fetchall()}
    # Writers commit in position order (the library locks the table for each
    # insert), so nothing can appear below ``last`` after this read.
    return counts, last
