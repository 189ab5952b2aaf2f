"""The order of the event log, and the commit horizon every reader of the whole log follows.

Writers insert without a table lock, so positions (``notification_id``, a
sequence value taken at insert) are not committed in order: a reader that
has read up to position 102 could later see 101 appear. Each row therefore
also records the transaction that inserted it (``xact_id``,
``pg_current_xact_id()``), and readers of the whole log:

- order it by the pair (transaction id, position) — a ``Place``;
- read only rows whose transaction is older than the oldest transaction
  still running in the cluster (``pg_snapshot_xmin(pg_current_snapshot())``,
  "the horizon"), taken in the same statement as the rows.

Every transaction below the horizon has ended and no new transaction can
get an id below it, so the committed rows below the horizon never change
again, and they come first in the order: a reader that keeps its place as a
pair and only moves past rows below the horizon can never pass a row that
commits later. Rows stored before transaction ids were recorded (NULL) were
written under the old table lock, in position order; they count as
transaction 0, before every newer row. See docs/log-order.md.

A client-facing *position* stays one number, the event's ``notification_id``:
it names one event. To compare it with a reader's place, the event's
transaction id is looked up (``place_of``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from eventsourcing.persistence import Notification, Tracking
from psycopg import Cursor, sql

from turnlog.application.errors import InvalidPosition
from turnlog.application.store.database import rendered

# The sort key of a row: old rows (NULL) first, as transaction 0.
XACT = sql.SQL("coalesce(xact_id, '0'::xid8)")
HORIZON = sql.SQL("pg_snapshot_xmin(pg_current_snapshot())")
INDEX_NAME_SUFFIX = "_log_order_idx"


@dataclass(frozen=True, order=True)
class Place:
    """A place in the log's order: (inserting transaction id, position)."""

    xact: int
    position: int

    @classmethod
    def start(cls) -> Place:
        return cls(0, 0)

    @classmethod
    def below(cls, horizon: int) -> Place:
        """Just before every row of transaction ``horizon``: after everything below it."""
        return cls(horizon, 0)

    def params(self) -> tuple[str, int]:
        """As statement parameters for ``PAST``/``UP_TO`` (xid8 goes as text)."""
        return str(self.xact), self.position


@dataclass(frozen=True)
class LogTracking(Tracking):
    """The library's tracking object, with the event's transaction id: its full place."""

    xact: int = 0

    @property
    def place(self) -> Place:
        return Place(self.xact, self.notification_id)


def place_of_tracking(tracking: Tracking) -> Place:
    """The place a tracking object stands for (plain ones: transaction 0, position order)."""
    return Place(getattr(tracking, "xact", 0), tracking.notification_id)


# After a place (exclusive) / up to a place (inclusive), in log order.
PAST = sql.SQL("({}, notification_id) > (%s::xid8, %s)").format(XACT)
UP_TO = sql.SQL("({}, notification_id) <= (%s::xid8, %s)").format(XACT)
BELOW_HORIZON = sql.SQL("{} < {}").format(XACT, HORIZON)
LOG_ORDER = sql.SQL("{}, notification_id").format(XACT)


def table(schema: str, events_table: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(events_table))


def add_column_statement(schema: str, table_name: str, alter: sql.Composable) -> sql.Composed:
    """Run ``alter`` only when ``table_name`` has no ``xact_id`` column yet."""
    return sql.SQL(
        "DO $MIGRATE$ BEGIN"
        " IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = {regclass}::regclass"
        "   AND attname = 'xact_id' AND NOT attisdropped) THEN {alter} END IF;"
        " END $MIGRATE$"
    ).format(regclass=sql.Literal(f"{_quoted(schema)}.{_quoted(table_name)}"), alter=alter)


def index_name(events_table: str) -> str:
    """The name of the index of the log's order on ``events_table``."""
    return f"{events_table}{INDEX_NAME_SUFFIX}"[:63]


def migration_statements(schema: str, events_table: str) -> list[sql.Composed]:
    """Make an events table written by older code carry transaction ids (idempotent).

    Adds the column (NULL for existing rows: no rewrite of stored events),
    its default (so any inserter records it) and the index of the log's
    order. The ALTERs run only when the column is missing, so a process
    starting later takes no ACCESS EXCLUSIVE lock on a table in use.
    """
    qualified = table(schema, events_table)
    index = sql.Identifier(index_name(events_table))
    alter = sql.SQL(
        "ALTER TABLE {table} ADD COLUMN xact_id xid8;"
        " ALTER TABLE {table} ALTER COLUMN xact_id SET DEFAULT pg_current_xact_id();"
    ).format(table=qualified)
    return [
        add_column_statement(schema, events_table, alter),
        sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (({}), notification_id)").format(
            index, qualified, XACT
        ),
    ]


@dataclass(frozen=True)
class LogPage:
    """Rows of the log below the horizon, in log order, and where the next read begins.

    Every event of the log between ``after`` and ``next`` is in ``records``:
    a reader that has read this page has read the log up to ``next``.
    """

    records: list[tuple[Place, Notification]]
    horizon: int
    # Rows committed past the horizon exist: an older transaction still runs,
    # and they become readable when it ends (a reader may look again soon).
    pending: bool = False
    after: Place = Place(0, 0)
    next: Place = Place(0, 0)
    # When the server that was read had started (``store.epoch``): what a page read
    # before a restart holds may have been lost in it. None: not known.
    epoch: datetime | None = None

    @property
    def last(self) -> Place | None:
        return self.records[-1][0] if self.records else None

    def __len__(self) -> int:
        return len(self.records)


# ``pending`` compares the log's highest transaction id with the horizon: one
# probe at the end of the log-order index. ``EXISTS (… WHERE xact >= horizon)``
# said the same, but without fresh statistics it was planned as a scan of the
# whole table (the horizon is unknown when planning): a cost that grew with
# every event the namespace kept, paid on every read of the tail.
_READ = sql.SQL(
    "WITH h AS (SELECT {horizon} AS x)"
    " SELECT e.*, h.x::text AS horizon, pg_postmaster_start_time() AS epoch,"
    "  coalesce((SELECT {xact} FROM {t} ORDER BY {xact} DESC LIMIT 1) >= h.x, false)"
    "   AS pending"
    " FROM h LEFT JOIN LATERAL ("
    "  SELECT notification_id, originator_id, originator_version, topic, state,"
    "   {xact}::text AS xact FROM {t}"
    "  WHERE {past} AND {xact} < h.x AND {stop}"
    "  ORDER BY {order} LIMIT %s) e ON true"
    " ORDER BY e.xact::xid8, e.notification_id"
)


def read_statement(qualified: sql.Composable, *, stop: bool) -> sql.Composed:
    """``read_log``'s statement; parameters: the place after, the stop's (if any), the limit."""
    return _READ.format(
        horizon=HORIZON,
        t=qualified,
        xact=XACT,
        past=PAST,
        stop=UP_TO if stop else sql.SQL("true"),
        order=LOG_ORDER,
    )


@functools.lru_cache(maxsize=64)
def _read_once(qualified: bytes, *, stop: bool) -> bytes:
    """``read_statement`` for a table, composed once (``store.database.rendered``)."""
    return rendered(read_statement(sql.SQL(qualified.decode()), stop=stop))


def read_log(
    curs: Cursor[Any],
    qualified: sql.Composable,
    after: Place,
    limit: int,
    stop: Place | None = None,
) -> LogPage:
    """Up to ``limit`` events past ``after`` (and up to ``stop``), in log order.

    Only rows below the horizon are read, with the horizon taken in the same
    statement: the rows returned, and every row before them, are final.
    """
    statement = _read_once(qualified.as_bytes(None), stop=stop is not None)
    params: list[Any] = [*after.params(), *(stop.params() if stop else ()), limit]
    rows = curs.execute(statement, params).fetchall()
    records = [
        (
            Place(int(r["xact"]), int(r["notification_id"])),
            Notification(
                id=int(r["notification_id"]),
                originator_id=r["originator_id"],
                originator_version=int(r["originator_version"]),
                topic=str(r["topic"]),
                state=bytes(r["state"]),
            ),
        )
        for r in rows
        if r["notification_id"] is not None
    ]
    first = rows[0] if rows else None
    horizon = int(first["horizon"]) if first else 0
    pending = bool(first["pending"]) if first else False
    epoch = first["epoch"] if first else None
    if records and len(records) == limit:
        after_all = records[-1][0]  # more may follow: go on from the last row read
    elif stop is not None:
        after_all = max(after, min(stop, Place.below(horizon)))
    else:
        after_all = max(after, Place.below(horizon))
    return LogPage(records, horizon, pending, after, after_all, epoch)


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def current_horizon(curs: Cursor[Any]) -> int:
    """The horizon now: the oldest transaction id still running (or the next one)."""
    row = curs.execute(sql.SQL("SELECT {}::text AS h").format(HORIZON)).fetchone()
    return int(_value(row, "h"))


def place_of(curs: Cursor[Any], qualified: sql.Composable, position: int) -> Place:
    """The place of the event at ``position``; ``InvalidPosition`` if no event has it.

    Position 0 is the start of the log.
    """
    if position == 0:
        return Place.start()
    if position < 0:
        raise InvalidPosition(f"position {position} is not a position of this log")
    row = curs.execute(
        sql.SQL(
            "SELECT {xact}::text AS x, (SELECT max(notification_id) FROM {t}) AS head"
            " FROM {t} WHERE notification_id = %s"
        ).format(xact=XACT, t=qualified),
        (position,),
    ).fetchone()
    if row is None:
        head_row = curs.execute(
            sql.SQL("SELECT coalesce(max(notification_id), 0) AS head FROM {}").format(qualified)
        ).fetchone()
        head = int(_value(head_row, "head"))
        if position > head:
            raise InvalidPosition(
                f"position {position} is past the end of this log (position {head})", head=head
            )
        raise InvalidPosition(
            f"position {position} is not the position of an event in this log"
            " (a position from another namespace, or of a purged session?)",
            head=head,
        )
    return Place(int(_value(row, "x")), position)


def _value(row: Any, key: str) -> Any:
    if row is None:
        return 0
    return row[key] if isinstance(row, dict) else row[0]


# The oldest transaction holding an id, cluster-wide: what holds the horizon back.
# Transactions of every database count (transaction ids are cluster-wide), and
# prepared transactions too. Without pg_read_all_stats, other roles' sessions
# may show no transaction id and are missed.
_HOLDER = sql.SQL(
    "SELECT * FROM ("
    " SELECT pid, datname AS database, application_name, state,"
    "   extract(epoch FROM clock_timestamp() - xact_start)::float8 AS age, age(backend_xid) AS n"
    " FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()"
    " UNION ALL"
    " SELECT NULL, database, 'prepared transaction ' || gid, 'prepared',"
    "   extract(epoch FROM clock_timestamp() - prepared)::float8, age(transaction)"
    " FROM pg_prepared_xacts"
    ") t ORDER BY n DESC LIMIT 1"
)


def horizon_holder(curs: Cursor[Any]) -> dict[str, Any]:
    """The horizon and who holds it back: {xact, age_seconds, pid, database, application_name}.

    ``age_seconds`` is how long the oldest transaction holding an id has been
    running (0.0 when none is: readers are not held back); ``pid`` is its
    server process (None when none, or a prepared transaction).
    """
    horizon = current_horizon(curs)
    row = curs.execute(_HOLDER).fetchone()
    if row is None:
        return {
            "xact": horizon,
            "age_seconds": 0.0,
            "pid": None,
            "database": None,
            "application_name": None,
        }
    keys = ("pid", "database", "application_name", "state", "age", "n")
    get = (row if isinstance(row, dict) else dict(zip(keys, row, strict=True))).get
    return {
        "xact": horizon,
        "age_seconds": round(max(float(get("age") or 0.0), 0.0), 3),
        "pid": get("pid"),
        "database": get("database"),
        "application_name": get("application_name") or "",
    }
