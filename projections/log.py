"""The Sessions application's log, as the read models read it.

Events are read straight from the application's recorder and decoded with
the application's own mapper, so a read model sees exactly what the
aggregate would. One ``EventLog`` (one connection pool) serves every read
model in a process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from eventsourcing.persistence import Notification, Tracking
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
from psycopg import sql

from turnlog.application import database
from turnlog.application.database import Database
from turnlog.application.sessions import Sessions
from turnlog.application.settings import Settings
from turnlog.projections.catalog import ReadModel


class EventLog:
    """Reading and decoding the namespace's event log."""

    def __init__(self, sessions: Sessions) -> None:
        recorder = sessions.recorder
        if not isinstance(recorder, PostgresApplicationRecorder):
            raise TypeError("read models need the Sessions application on PostgreSQL")
        self.sessions = sessions
        self.application_name = sessions.name
        self.recorder = recorder
        self.datastore: PostgresDatastore = recorder.datastore
        self.schema = self.datastore.schema
        self.events_table = recorder.events_table_name
        # The library NOTIFYs this channel in every insert transaction.
        self.channel = recorder.channel_name

    def read(self, after: int, limit: int, stop: int | None = None) -> Sequence[Notification]:
        """Up to ``limit`` events after position ``after`` (and up to ``stop``), in log order."""
        found: Sequence[Notification] = self.recorder.select_notifications(
            start=after, limit=limit, stop=stop, inclusive_of_start=False
        )
        return found

    def decode(self, notifications: Sequence[Notification]) -> list[tuple[Any, Tracking]]:
        """Domain events with their tracking objects, decoded by the application's mapper."""
        to_event = self.sessions.mapper.to_domain_event
        name = self.application_name
        return [(to_event(n), Tracking(name, n.id)) for n in notifications]

    def head(self) -> int:
        """The last position in the log (0 when empty)."""
        return self.recorder.max_notification_id() or 0

    def count_after(self, position: int) -> int:
        """How many events the log holds after ``position``."""
        statement = sql.SQL("SELECT count(*) AS n FROM {}.{} WHERE notification_id > %s").format(
            sql.Identifier(self.schema), sql.Identifier(self.events_table)
        )
        with self.datastore.get_connection() as conn:
            row = conn.execute(statement, (position,)).fetchone()
        return int(cast(Any, row)["n"]) if row else 0

    def close(self) -> None:
        self.sessions.close()


def open_log(db: Database, settings: Settings) -> EventLog:
    """A Sessions application of its own for reading (schema and tables made if missing)."""
    with database.bootstrap_lock(db) as conn:
        database.create_schema(conn, settings.namespace)
        sessions = Sessions(
            env=database.library_env(db, settings, create_table=True),
            snapshot_interval=settings.snapshot_interval,
        )
    return EventLog(sessions)


def create_tables(db: Database, log: EventLog, models: Sequence[ReadModel]) -> None:
    """Create the read models' tables (idempotent), under the bootstrap lock."""
    with database.bootstrap_lock(db):
        for model in models:
            model.postgres_view(log.datastore).create_table()
