"""The Sessions application's log, as the read models read it.

Events are read in the log's order, (transaction id, position), and only
below the commit horizon (``application.store.logorder``), so no reader passes an
event that commits later. They are read straight from the events table and decoded with
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

from turnlog.application.sessions import Sessions
from turnlog.application.store import database, logorder
from turnlog.application.store.database import Database
from turnlog.application.store.logorder import LogPage, LogTracking, Place
from turnlog.projections.catalog import ReadModel


class EventLog:
    """Reading and decoding the namespace's event log, in log order, below the horizon."""

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
        self.table = logorder.table(self.schema, self.events_table)

    def read(self, after: Place, limit: int, stop: Place | None = None) -> LogPage:
        """Up to ``limit`` events past ``after`` (and up to ``stop``), in log order.

        Only rows below the horizon are read, with the horizon taken in the
        same statement: the rows returned, and every row before them, are
        final.
        """
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            return logorder.read_log(curs, self.table, after, limit, stop)

    def decode(self, records: Sequence[tuple[Place, Notification]]) -> list[tuple[Any, Tracking]]:
        """Domain events with their tracking objects (their places), by the application's mapper."""
        to_event = self.sessions.mapper.to_domain_event
        name = self.application_name
        return [
            (to_event(n), LogTracking(name, place.position, place.xact)) for place, n in records
        ]

    def place_of(self, position: int) -> Place:
        """The place of the event at ``position`` (0: the start); InvalidPosition if none."""
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            return logorder.place_of(curs, self.table, position)

    def head_place(self) -> Place:
        """The last committed event in log order (also past the horizon); the start if none."""
        statement = sql.SQL(
            "SELECT {xact}::text AS x, notification_id FROM {t} ORDER BY {order} DESC LIMIT 1"
        ).format(
            xact=logorder.XACT,
            t=self.table,
            order=sql.SQL("{} DESC, notification_id").format(logorder.XACT),
        )
        with self.datastore.get_connection() as conn:
            row = conn.execute(statement).fetchone()
        return Place(int(row["x"]), int(row["notification_id"])) if row else Place.start()

    def head(self) -> int:
        """The position of the last committed event in log order (0 when empty)."""
        return self.head_place().position

    def count_after(self, place: Place) -> int:
        """How many committed events the log holds past ``place``."""
        statement = sql.SQL("SELECT count(*) AS n FROM {} WHERE {}").format(
            self.table, logorder.PAST
        )
        with self.datastore.get_connection() as conn:
            row = conn.execute(statement, place.params()).fetchone()
        return int(cast(Any, row)["n"]) if row else 0

    def horizon(self) -> dict[str, Any]:
        """The horizon, its age and the server process holding it back (see logorder)."""
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            return logorder.horizon_holder(curs)


def create_tables(db: Database, log: EventLog, models: Sequence[ReadModel]) -> None:
    """Create the read models' tables (idempotent), under the bootstrap lock."""
    with database.bootstrap_lock(db):
        for model in models:
            model.postgres_view(log.datastore).create_table()
