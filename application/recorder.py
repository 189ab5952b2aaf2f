"""The events recorder: the library's PostgreSQL recorder, one round trip per save.

The library's default insert path takes ``LOCK TABLE … IN EXCLUSIVE MODE``,
sends ``NOTIFY`` and inserts the rows in a pipelined transaction that still
needs several round trips; its optional database function drops the table
lock, which lets subscribers skip events under concurrent writers (see the
notes on 9.5.6). This recorder keeps every guarantee of the default path —
the table lock (insert order equals commit order), the notification, the
optimistic-concurrency primary key — but runs them inside one function
called in one autocommit statement: one round trip per save.

The function is created per namespace schema, named for this table, so two
applications in one schema could not confuse each other's tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eventsourcing.persistence import StoredEvent
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
from eventsourcing.utils import retry
from psycopg import InterfaceError, OperationalError
from psycopg.sql import SQL, Identifier

from turnlog.application.errors import ApplicationError


class TurnlogRecorder(PostgresApplicationRecorder):
    """Inserts a save's events with lock, notify and insert in one statement."""

    def __init__(
        self, datastore: PostgresDatastore, *, events_table_name: str = "stored_events"
    ) -> None:
        super().__init__(datastore, events_table_name=events_table_name)
        schema = Identifier(self.datastore.schema)
        table = Identifier(self.events_table_name)
        function = Identifier(f"turnlog_insert_{self.events_table_name}")
        self.sql_create_statements.append(
            SQL(
                "CREATE OR REPLACE FUNCTION {schema}.{function}("
                " ids uuid[], versions bigint[], topics text[], states bytea[])"
                " RETURNS SETOF bigint LANGUAGE plpgsql AS $BODY$"
                " BEGIN"
                "   SET LOCAL lock_timeout = '{lock_timeout}s';"
                # Serialise inserts so notification ids are committed in order:
                # a reader tailing the log never passes a gap filled later.
                "   LOCK TABLE {schema}.{table} IN EXCLUSIVE MODE;"
                "   NOTIFY {channel};"
                "   RETURN QUERY INSERT INTO {schema}.{table}"
                "     (originator_id, originator_version, topic, state)"
                "     SELECT * FROM unnest(ids, versions, topics, states)"
                "     RETURNING notification_id;"
                " END;"
                " $BODY$"
            ).format(
                schema=schema,
                function=function,
                table=table,
                channel=Identifier(self.channel_name),
                lock_timeout=self.datastore.lock_timeout,
            )
        )
        self._insert_call = SQL(
            "SELECT * FROM {schema}.{function}(%s::uuid[], %s::bigint[], %s::text[], %s::bytea[])"
        ).format(schema=schema, function=function)

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> Sequence[int]:
        if kwargs.get("tracking") is not None:
            raise ApplicationError("this recorder does not record tracking positions")
        if not stored_events:
            return []
        params = (
            [e.originator_id for e in stored_events],
            [e.originator_version for e in stored_events],
            [e.topic for e in stored_events],
            [e.state for e in stored_events],
        )
        # Autocommit: the one statement is its own transaction, so the lock is
        # held only for the insert and released at its commit.
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            curs.execute(self._insert_call, params, prepare=True)
            rows = curs.fetchall()
        return [int(next(iter(row.values()))) for row in rows]
