"""The views projections write through: Postgres (exactly once) and in memory.

This is the library's exactly-once pattern (a ``PostgresTrackingRecorder``
subclass whose writes record the tracking position in the same transaction
as the view rows), extended in one way: a *batch* of events is folded in
memory and written with ONE tracking update, so catching up and rebuilding
cost one transaction per batch instead of one per event.

Outside a batch the view behaves like the library's examples: every event is
its own transaction, and the library's ``ProjectionRunner`` can drive it
unchanged (the benchmark does, as its baseline).

A view instance belongs to one thread at a time: the open batch is state of
the instance.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from eventsourcing.persistence import IntegrityError, Tracking, TrackingRecorder
from eventsourcing.postgres import PostgresDatastore, PostgresTrackingRecorder
from eventsourcing.projection import Projection
from psycopg import Connection, Cursor, sql
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb

from turnlog.application.errors import ProjectionConflict
from turnlog.application.store import epoch as store_epoch
from turnlog.application.store import logorder
from turnlog.application.store.database import rendered
from turnlog.application.store.logorder import Place, place_of_tracking
from turnlog.projections.rows import Key, Row, Rows, Table, storable_key


class ReadModelView(TrackingRecorder, ABC):
    """What a projection's handlers write through: the rows an event changes."""

    table: Table

    @abstractmethod
    def change(self, event: Any, tracking: Tracking) -> AbstractContextManager[Rows]:
        """The rows ``event`` may change; the changes are recorded with ``tracking``."""


class MemoryView(ReadModelView):
    """All rows of a read model in memory: the reference fold for verify and audit."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self.rows = Rows(table)
        self._positions: dict[str, Place] = {}

    @contextmanager
    def change(self, event: Any, tracking: Tracking) -> Iterator[Rows]:
        self.insert_tracking(tracking)
        yield self.rows
        self.rows.clear_pending()

    def insert_tracking(self, tracking: Tracking) -> None:
        current = self._positions.get(tracking.application_name, Place.start())
        self._positions[tracking.application_name] = max(current, place_of_tracking(tracking))

    def max_tracking_id(self, application_name: str) -> int | None:
        place = self._positions.get(application_name)
        return place.position if place is not None else None


class PostgresReadModelView(PostgresTrackingRecorder, ReadModelView):
    """A read model's table and its tracking table, written exactly once per event.

    The table is named after the tracking table (``<name>_tracking`` →
    ``<name>``), so the library's factory, which names the tracking table
    after the projection, also decides the view's table.

    The tracking row holds a *place* in the log's order (``xact_id``,
    ``notification_id``; see ``application.store.logorder``). A row written by
    older code has no ``xact_id``: it stands for (0, position), which is
    exactly what it meant then (every event up to that position, all of them
    stored before transaction ids were recorded).
    """

    def __init__(
        self, datastore: PostgresDatastore, *, tracking_table_name: str, **kwargs: Any
    ) -> None:
        super().__init__(datastore, tracking_table_name=tracking_table_name, **kwargs)
        self.table_name = tracking_table_name.removesuffix("_tracking")
        self.check_identifier_length(self.table_name)
        self._batch: Rows | None = None
        self._batch_position: Place | None = None
        self._compose_statements()

    # ---------------------------------------------------------------- writing

    # A batch folds many events in one transaction with one tracking update,
    # in three steps that several views interleave on one pipelined
    # connection (``fold_together``): each step's statements for every view
    # go in one round trip.
    #
    # 1. ``load``: the rows the events touch.
    # 2. the events are folded, in memory (``change`` and ``insert_tracking``
    #    see the open batch).
    # 3. ``finish``: the claim, the rows' writes and the new place, checked
    #    before the caller commits.
    #
    # The claim locks the tracking row and compares it with ``expected``, the
    # place the caller read before it chose the batch: if another runner
    # advanced it, the batch is refused (``ProjectionConflict``) instead of
    # applying events twice. (The library's own check, that the tracking
    # upsert only moves forward, is not enough for batches of different
    # lengths.) It comes last, not first: a transaction takes a transaction
    # id at its first write, and while that id runs it holds the log's commit
    # horizon for every reader of the log (application/store/logorder.py); claimed
    # first, a batch held it through its loads and all of its folding,
    # hundreds of milliseconds on a busy machine. Loading before the claim is
    # as safe: every write of a view commits with its place, so rows changed
    # since the load mean a moved place, and the claim refuses the batch
    # before anything commits.

    def load(self, conn: Connection[DictRow], scopes: Iterable[Key]) -> Callable[[], None]:
        """Send the load of the batch's rows; the function returned opens the batch with them."""
        curs = conn.cursor()
        wanted = self._keys(scopes)
        if wanted:
            curs.execute(self._load_rows, self._columns(wanted))

        def opened() -> None:
            loaded = curs.fetchall() if wanted else []
            self._batch = Rows(self.table, (dict(r) for r in loaded))
            self._batch_position = None

        return opened

    def finish(
        self, conn: Connection[DictRow], application_name: str, expected: Place | None
    ) -> Callable[[], None]:
        """Send the claim, the writes and the new place; the function returned checks them."""
        rows, place = self._batch, self._batch_position
        assert rows is not None, "finish() without an open batch"
        # One cursor per statement whose result is read: in a pipeline, a cursor's
        # fetch waits only until the cursor has *a* result, which on a cursor that
        # sent several statements may be an earlier one's (the writes' DELETE).
        claim, writes, placed = conn.cursor(), conn.cursor(), conn.cursor()
        claim.execute(self._claim, (application_name,), prepare=True)
        if place is not None:
            self._flush(writes, rows)
            placed.execute(
                self._upsert_place, self._place_params(application_name, place), prepare=True
            )

        def checked() -> None:
            self._check_claim(claim.fetchone(), expected)
            if place is not None:
                self._check_place(placed.fetchone(), application_name, place)

        return checked

    def close(self) -> None:
        """End the open batch (written or not)."""
        self._batch = None

    @contextmanager
    def change(self, event: Any, tracking: Tracking) -> Iterator[Rows]:
        if self._batch is not None:
            self._batch_position = place_of_tracking(tracking)
            yield self._batch
            return
        # One event, one transaction: the library's pattern.
        with self.datastore.transaction(commit=True) as curs:
            self._insert_tracking(curs, tracking)
            scope = self.table.scope_of(event)
            rows = self._load(curs, [scope] if scope is not None else [])
            yield rows
            self._flush(curs, rows)

    def insert_tracking(self, tracking: Tracking) -> None:
        """Track an event the projection ignores (inside a batch: at the batch's end)."""
        if self._batch is not None:
            self._batch_position = place_of_tracking(tracking)
            return
        super().insert_tracking(tracking)

    def _insert_tracking(self, curs: Cursor[DictRow], tracking: Tracking) -> None:
        """Record ``tracking``'s place; IntegrityError unless it is past the recorded one."""
        self._insert_place(curs, tracking.application_name, place_of_tracking(tracking))

    def _insert_place(self, curs: Cursor[DictRow], application_name: str, place: Place) -> None:
        params = self._place_params(application_name, place)
        self._check_place(
            curs.execute(self._upsert_place, params, prepare=True).fetchone(),
            application_name,
            place,
        )

    @staticmethod
    def _place_params(application_name: str, place: Place) -> tuple[str, int, str]:
        return (application_name, place.position, str(place.xact))

    @staticmethod
    def _check_place(found: Any, application_name: str, place: Place) -> None:
        if found is None:
            raise IntegrityError(
                f"Failed to record tracking for {application_name} {place.position}"
                f" (transaction {place.xact}): not past the recorded place"
            )

    def reset(self, application_name: str) -> None:
        """Delete every row and the position, in one transaction (never TRUNCATE tracking)."""
        with self.datastore.transaction(commit=True) as curs:
            curs.execute(self._delete_all)
            curs.execute(self._delete_position, (application_name,))

    # ---------------------------------------------------------------- reading

    def position(self, application_name: str) -> Place:
        """The place of the last event processed (the start before the first)."""
        with self.datastore.get_connection() as conn:
            found = conn.execute(self._select_position, (application_name,)).fetchone()
        return _place(found)

    def select(
        self,
        filters: Mapping[str, Any],
        order: Sequence[str],
        *,
        descending: bool,
        after: Key | None,
        limit: int,
    ) -> list[Row]:
        """One keyset page: rows matching ``filters`` (column = value), past ``after``."""
        conditions = [sql.SQL("{} = %s").format(sql.Identifier(column)) for column in filters]
        params: list[Any] = list(filters.values())
        columns = sql.SQL(", ").join(sql.Identifier(c) for c in order)
        if after is not None:
            conditions.append(
                sql.SQL("({}) {} ({})").format(
                    columns,
                    sql.SQL("<" if descending else ">"),
                    sql.SQL(", ").join(sql.Placeholder() * len(order)),
                )
            )
            params.extend(after)
        direction = sql.SQL(" DESC" if descending else "")
        statement = sql.SQL("SELECT {} FROM {} {} ORDER BY {} LIMIT %s").format(
            self._column_list,
            self._qualified,
            sql.SQL("WHERE ") + sql.SQL(" AND ").join(conditions) if conditions else sql.SQL(""),
            sql.SQL(", ").join(sql.Identifier(c) + direction for c in order),
        )
        params.append(limit)
        with self.datastore.get_connection() as conn:
            return [dict(r) for r in conn.execute(statement, params).fetchall()]

    def count(self, filters: Mapping[str, Any]) -> int:
        """How many rows match ``filters`` (column = value)."""
        conditions = [sql.SQL("{} = %s").format(sql.Identifier(c)) for c in filters]
        statement = sql.SQL("SELECT count(*) AS n FROM {} {}").format(
            self._qualified,
            sql.SQL("WHERE ") + sql.SQL(" AND ").join(conditions) if conditions else sql.SQL(""),
        )
        with self.datastore.get_connection() as conn:
            row = conn.execute(statement, list(filters.values())).fetchone()
        return int(row["n"]) if row else 0

    def snapshot(
        self, application_name: str, filters: Mapping[str, Any] | None = None
    ) -> tuple[Place, list[Row]]:
        """The position and the rows (matching ``filters``) as one consistent snapshot."""
        filters = filters or {}
        conditions = [sql.SQL("{} = %s").format(sql.Identifier(c)) for c in filters]
        statement = sql.SQL("SELECT {} FROM {} {}").format(
            self._column_list,
            self._qualified,
            sql.SQL("WHERE ") + sql.SQL(" AND ").join(conditions) if conditions else sql.SQL(""),
        )
        with self.datastore.get_connection() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            found = conn.execute(self._select_position, (application_name,)).fetchone()
            rows = [dict(r) for r in conn.execute(statement, list(filters.values())).fetchall()]
        return _place(found), rows

    # ---------------------------------------------------------------- SQL

    def _check_claim(self, found: Any, expected: Place | None) -> None:
        """Refuse the batch unless the (locked) tracking row is where the caller read it."""
        current, wanted = _place(found), expected or Place.start()
        if current != wanted:
            raise ProjectionConflict(
                f"{self.table_name} is at position {current.position} (transaction"
                f" {current.xact}), not {wanted.position} (transaction {wanted.xact}):"
                " another runner advanced it"
            )

    @staticmethod
    def _keys(scopes: Iterable[Key]) -> list[Key]:
        return list(dict.fromkeys(storable_key(scope) for scope in scopes))

    @staticmethod
    def _columns(wanted: list[Key]) -> list[list[Any]]:
        return [list(values) for values in zip(*wanted, strict=True)]

    def _load(self, curs: Cursor[DictRow], scopes: Iterable[Key]) -> Rows:
        wanted = self._keys(scopes)
        if not wanted:
            return Rows(self.table)
        found = curs.execute(self._load_rows, self._columns(wanted)).fetchall()
        return Rows(self.table, (dict(r) for r in found))

    def _flush(self, curs: Cursor[DictRow], rows: Rows) -> None:
        upserts, deletes = rows.pending()
        if upserts:
            names = self.table.names
            curs.executemany(self._upsert, [tuple(_param(r[n]) for n in names) for r in upserts])
        if deletes:
            curs.executemany(self._delete, deletes)
        rows.clear_pending()

    def _compose_statements(self) -> None:
        table = self.table
        ident = sql.Identifier
        self._qualified = sql.SQL("{}.{}").format(
            ident(self.datastore.schema), ident(self.table_name)
        )
        tracking = sql.SQL("{}.{}").format(
            ident(self.datastore.schema), ident(self.tracking_table_name)
        )
        self._column_list = sql.SQL(", ").join(ident(c) for c in table.names)
        keys = sql.SQL(", ").join(ident(c) for c in table.key)
        self.sql_create_statements.append(
            sql.SQL("CREATE TABLE IF NOT EXISTS {} ({}, PRIMARY KEY ({}))").format(
                self._qualified,
                sql.SQL(", ").join(
                    sql.SQL("{} {}").format(ident(name), sql.SQL(sql_type))
                    for name, sql_type in table.columns
                ),
                keys,
            )
        )
        # A column added to a read model after its table was created (rows folded
        # before it hold NULL there until a rebuild; handlers read it as empty).
        for name, sql_type in table.columns:
            self.sql_create_statements.append(
                sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}").format(
                    self._qualified, ident(name), sql.SQL(sql_type)
                )
            )
        for columns in table.indexes:
            index_name = f"{self.table_name}_{'_'.join(columns)}_idx"[: self.MAX_IDENTIFIER_LEN]
            self.sql_create_statements.append(
                sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} ({})").format(
                    ident(index_name),
                    self._qualified,
                    sql.SQL(", ").join(ident(c) for c in columns),
                )
            )
        self._load_rows = rendered(
            sql.SQL("SELECT {} FROM {} WHERE ({}) IN (SELECT * FROM unnest({}))").format(
                self._column_list,
                self._qualified,
                sql.SQL(", ").join(ident(c) for c in table.scope),
                sql.SQL(", ").join(
                    sql.SQL("%s::{}[]").format(sql.SQL(table.sql_type(c))) for c in table.scope
                ),
            )
        )
        updates = [c for c in table.names if c not in table.key]
        self._upsert = rendered(
            sql.SQL("INSERT INTO {} ({}) VALUES ({}) ON CONFLICT ({}) DO UPDATE SET {}").format(
                self._qualified,
                self._column_list,
                sql.SQL(", ").join(sql.Placeholder() * len(table.names)),
                keys,
                sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(ident(c)) for c in updates),
            )
        )
        self._delete = rendered(
            sql.SQL("DELETE FROM {} WHERE {}").format(
                self._qualified,
                sql.SQL(" AND ").join(sql.SQL("{} = %s").format(ident(c)) for c in table.key),
            )
        )
        self._delete_all = sql.SQL("DELETE FROM {}").format(self._qualified)
        self._delete_position = sql.SQL("DELETE FROM {} WHERE application_name = %s").format(
            tracking
        )
        place = sql.SQL("notification_id, coalesce(xact_id, '0'::xid8)::text AS xact")
        # Upserting with a no-op update locks the row (made if missing) and returns it.
        self._claim = rendered(
            sql.SQL(
                "INSERT INTO {t} AS r (application_name, notification_id) VALUES (%s, 0)"
                " ON CONFLICT (application_name) DO UPDATE SET notification_id = r.notification_id"
                " RETURNING {place}"
            ).format(
                t=tracking,
                place=sql.SQL("r.notification_id, coalesce(r.xact_id, '0'::xid8)::text AS xact"),
            )
        )
        self._select_position = sql.SQL("SELECT {} FROM {} WHERE application_name = %s").format(
            place, tracking
        )
        self._upsert_place = rendered(
            sql.SQL(
                "INSERT INTO {t} AS r (application_name, notification_id, xact_id)"
                " VALUES (%s, %s, %s::xid8) ON CONFLICT (application_name) DO UPDATE"
                " SET notification_id = EXCLUDED.notification_id, xact_id = EXCLUDED.xact_id"
                " WHERE (coalesce(r.xact_id, '0'::xid8), r.notification_id)"
                "  < (EXCLUDED.xact_id, EXCLUDED.notification_id)"
                " RETURNING notification_id"
            ).format(t=tracking)
        )
        # Tracking tables made by older code gain the column (NULL: transaction 0).
        self.sql_create_statements.append(
            logorder.add_column_statement(
                self.datastore.schema,
                self.tracking_table_name,
                sql.SQL("ALTER TABLE {} ADD COLUMN xact_id xid8;").format(tracking),
            )
        )


def _param(value: Any) -> Any:
    """A row's value as a statement parameter: a dict is a jsonb column's."""
    return Jsonb(value) if isinstance(value, dict) else value


def _place(found: Any) -> Place:
    if not found:
        return Place.start()
    return Place(int(found["xact"]), int(found["notification_id"] or 0))


@dataclass(frozen=True)
class Fold:
    """Decoded events for one view, to apply as one batch from ``expected`` on."""

    view: PostgresReadModelView
    projection: Projection[ReadModelView]
    expected: Place
    events: Sequence[tuple[Any, Tracking]]


def fold_batch(
    view: PostgresReadModelView,
    projection: Projection[ReadModelView],
    expected: Place,
    events: Sequence[tuple[Any, Tracking]],
) -> Place:
    """Apply decoded events to the view as one batch; returns the new place."""
    return fold_together(view.datastore, [Fold(view, projection, expected, events)])[0]


def fold_together(
    datastore: PostgresDatastore, folds: Sequence[Fold], epoch: datetime | None = None
) -> list[Place]:
    """Apply each fold to its view as one batch, all of them in ONE transaction.

    Returns each view's new place. One commit for several read models: every
    view moves on, or (on any error) none does. ``epoch``: when the server the
    events were read from had started (``store.epoch``); the fold is refused
    (``store.epoch.ServerRestarted``) if it has started again since, as a commit that rode
    and was visible then may be gone.
    """
    live = [f for f in folds if f.events]
    if not live:
        return [f.expected for f in folds]
    with datastore.get_connection() as conn, conn.pipeline(), conn.transaction():
        try:
            same = store_epoch.same_epoch(conn, epoch) if epoch is not None else None
            for opened in [fold.view.load(conn, scopes_of(fold)) for fold in live]:
                opened()
            if same is not None:
                same()
            for fold in live:
                for event, tracking in fold.events:
                    fold.projection.process_event(event, tracking)
            checks = [
                fold.view.finish(conn, fold.events[0][1].application_name, fold.expected)
                for fold in live
            ]
        finally:
            for fold in live:
                fold.view.close()
        for checked in checks:
            checked()
    return [place_of_tracking(f.events[-1][1]) if f.events else f.expected for f in folds]


def scopes_of(fold: Fold) -> list[Key]:
    """The scopes (row groups) a fold's events touch."""
    scoped = (fold.view.table.scope_of(event) for event, _ in fold.events)
    return [scope for scope in scoped if scope is not None]
