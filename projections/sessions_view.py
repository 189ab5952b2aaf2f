"""The ``sessions`` read model: one row per session, newest activity first.

Status follows ``Session.status``: ``closed`` once closed, otherwise from
the last turn: ``busy`` (queued or running), ``blocked`` (interrupted),
``awaiting_approval`` (a proposed call waits for an operator), ``idle`` (no
turn, or the last one completed, failed, was abandoned or cancelled). With
follow-ups queued, the last turn is the newest of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from eventsourcing.dispatch import singledispatchmethod
from eventsourcing.persistence import Tracking
from eventsourcing.projection import Projection
from psycopg import sql
from psycopg.types.json import Jsonb

from turnlog.domain.session import Session
from turnlog.domain.turns import TurnState
from turnlog.projections.rows import Row, Rows, Table, session_scope
from turnlog.projections.view import PostgresReadModelView, ReadModelView

STATUSES = ("idle", "busy", "blocked", "awaiting_approval", "closed")
# How much of a title the search's index holds: at least the longest search text
# (projections.queries.MAX_SEARCH_CHARS), at most what a btree entry can take in UTF-8.
TITLE_PREFIX_CHARS = 200
TITLE_PREFIX = f"left(lower(title), {TITLE_PREFIX_CHARS})"

TABLE = Table(
    columns=(
        ("session_id", "uuid"),
        ("title", "text"),
        ("status", "text"),
        ("closed", "boolean"),
        ("turn_count", "integer"),
        ("last_turn_id", "text"),
        ("last_turn_state", "text"),
        ("unknown_call_ids", "text[]"),
        ("created_by", "text"),
        ("created_at", "timestamptz"),
        ("last_activity_at", "timestamptz"),
        ("last_position", "bigint"),
        ("version", "bigint"),
        # The session's metadata (NULL in rows folded before the column: a rebuild fills it).
        ("metadata", "jsonb"),
        # A fork's source (NULL: not a fork), so that the forks of a session, which hold
        # copies of its turns, can be found (before a purge of it, say).
        ("forked_from", "uuid"),
    ),
    key=("session_id",),
    scope=("session_id",),
    scope_of=session_scope,
    indexes=(("last_position",), ("status", "last_position"), ("forked_from", "last_position")),
)


def status_of(closed: bool, last_turn_state: str | None) -> str:
    """The session's status as ``Session.status`` computes it."""
    if closed:
        return "closed"
    if last_turn_state in (TurnState.QUEUED, TurnState.RUNNING):
        return "busy"
    if last_turn_state == TurnState.INTERRUPTED:
        return "blocked"
    if last_turn_state == TurnState.AWAITING_APPROVAL:
        return "awaiting_approval"
    return "idle"


class PostgresSessionsView(PostgresReadModelView):
    """The sessions table in PostgreSQL, and its list and search queries."""

    table = TABLE

    def _compose_statements(self) -> None:
        super()._compose_statements()
        # The search's indexes: id and title prefixes (case-insensitive) and metadata
        # containment, beside the plain columns' indexes of TABLE. The title's is on its
        # first TITLE_PREFIX_CHARS characters only: a btree entry holds at most ~2.7 kB, and
        # a longer title (the CLI and the Python API take any length) failed its row's
        # write, and so the read model, for good. A search text is no longer than that, so
        # a prefix of it matches the title exactly when it matches the indexed part.
        self.sql_create_statements.append(
            sql.SQL("DROP INDEX IF EXISTS {}.{}").format(
                sql.Identifier(self.datastore.schema), self._index_name("title_prefix")
            )
        )
        for suffix, spec in (
            ("id_prefix", "((session_id::text) text_pattern_ops)"),
            ("title_start", f"({TITLE_PREFIX} text_pattern_ops)"),
            ("metadata", "USING gin (metadata jsonb_path_ops)"),
        ):
            self.sql_create_statements.append(
                sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} {}").format(
                    self._index_name(suffix), self._qualified, sql.SQL(spec)
                )
            )

    def _index_name(self, suffix: str) -> sql.Identifier:
        return sql.Identifier(f"{self.table_name}_{suffix}_idx"[: self.MAX_IDENTIFIER_LEN])

    def list_sessions(
        self,
        status: str | None,
        limit: int,
        after: int | None,
        last_turn_state: str | None = None,
        text: str = "",
        metadata: Sequence[tuple[str, list[Any]]] = (),
        forked_from: UUID | None = None,
    ) -> list[Row]:
        """Sessions by latest activity (log position), newest first.

        ``text``: only those whose id or title starts with it (case-insensitive);
        ``metadata``: only those whose metadata has, for each key, one of the values;
        ``forked_from``: only the forks of that session.
        """
        filters: dict[str, Any] = {"status": status} if status else {}
        if last_turn_state:
            filters["last_turn_state"] = last_turn_state
        if forked_from is not None:
            filters["forked_from"] = forked_from
        if not text and not metadata:
            return self.select(
                filters,
                ("last_position",),
                descending=True,
                after=None if after is None else (after,),
                limit=limit,
            )
        conditions: list[sql.Composable] = [
            sql.SQL("{} = %s").format(sql.Identifier(c)) for c in filters
        ]
        params: list[Any] = list(filters.values())
        if text:
            pattern = _like_escaped(text.lower()) + "%"
            conditions.append(
                sql.SQL("(session_id::text LIKE %s OR {} LIKE %s)").format(sql.SQL(TITLE_PREFIX))
            )
            params += [pattern, pattern]
        for key, values in metadata:
            either = [sql.SQL("metadata @> %s") for _ in values]
            conditions.append(sql.SQL("(") + sql.SQL(" OR ").join(either) + sql.SQL(")"))
            params += [Jsonb({key: value}) for value in values]
        if after is not None:
            conditions.append(sql.SQL("last_position < %s"))
            params.append(after)
        statement = sql.SQL(
            "SELECT {} FROM {} WHERE {} ORDER BY last_position DESC LIMIT %s"
        ).format(self._column_list, self._qualified, sql.SQL(" AND ").join(conditions))
        with self.datastore.get_connection() as conn:
            return [dict(r) for r in conn.execute(statement, [*params, limit]).fetchall()]

    def search(self, text: str, limit: int) -> list[Row]:
        """Sessions whose id starts with ``text`` or whose title contains it, newest first."""
        pattern = _like_escaped(text)
        statement = sql.SQL(
            "SELECT {} FROM {} WHERE session_id::text LIKE %s OR title ILIKE %s"
            " ORDER BY last_position DESC LIMIT %s"
        ).format(self._column_list, self._qualified)
        params = (pattern.lower() + "%", "%" + pattern + "%", limit)
        with self.datastore.get_connection() as conn:
            return [dict(r) for r in conn.execute(statement, params).fetchall()]


class SessionsProjection(Projection[ReadModelView]):
    """Folds every session event into its session's row."""

    name = "sessions_view"

    @singledispatchmethod
    def process_event(self, domain_event: Any, tracking: Tracking) -> None:
        """Any other event: only the activity, position and version move."""
        with self.view.change(domain_event, tracking) as rows:
            _advance(rows, domain_event, tracking)

    @process_event.register
    def _(self, event: Session.Started, tracking: Tracking) -> None:
        with self.view.change(event, tracking) as rows:
            rows.put(_started(event, tracking))

    @process_event.register
    def _(self, event: Session.Forked, tracking: Tracking) -> None:
        # A fork starts with the source's finished turns: it counts them, and shows the last.
        row = {**_started(event, tracking), "forked_from": UUID(event.source_id)}
        if event.inherited_finished:
            last_id, last_state, _ = event.inherited_finished[-1]
            row.update(
                turn_count=len(event.inherited_finished),
                last_turn_id=last_id,
                last_turn_state=last_state,
            )
        with self.view.change(event, tracking) as rows:
            rows.put(row)

    @process_event.register
    def _(self, event: Session.TurnSubmitted, tracking: Tracking) -> None:
        with self.view.change(event, tracking) as rows:
            row = rows.get((event.originator_id,))
            count = row["turn_count"] + 1 if row else 0
            _advance(
                rows,
                event,
                tracking,
                turn_count=count,
                last_turn_id=event.turn_id,
                last_turn_state=TurnState.QUEUED.value,
                unknown_call_ids=[],
            )

    @process_event.register
    def _(self, event: Session.TurnClaimed, tracking: Tracking) -> None:
        with self.view.change(event, tracking) as rows:
            _advance_turn(rows, event, tracking, TurnState.RUNNING)

    @process_event.register(Session.TurnCompleted)
    @process_event.register(Session.TurnAbandoned)
    def _(self, event: Any, tracking: Tracking) -> None:
        state = (
            TurnState.COMPLETED if isinstance(event, Session.TurnCompleted) else TurnState.ABANDONED
        )
        with self.view.change(event, tracking) as rows:
            _advance_turn(rows, event, tracking, state, unknown_call_ids=[])

    @process_event.register
    def _(self, event: Session.TurnFailed, tracking: Tracking) -> None:
        with self.view.change(event, tracking) as rows:
            _advance_turn(rows, event, tracking, TurnState.FAILED, unknown_call_ids=[])

    @process_event.register
    def _(self, event: Session.TurnInterrupted, tracking: Tracking) -> None:
        with self.view.change(event, tracking) as rows:
            _advance_turn(
                rows, event, tracking, TurnState.INTERRUPTED, unknown_call_ids=list(event.call_ids)
            )

    @process_event.register
    def _(self, event: Session.ToolCallResolved, tracking: Tracking) -> None:
        with self.view.change(event, tracking) as rows:
            row = rows.get((event.originator_id,))
            if row is None or row["last_turn_id"] != event.turn_id:
                _advance(rows, event, tracking)
                return
            remaining = [c for c in row["unknown_call_ids"] if c != event.call_id]
            if remaining:
                _advance(rows, event, tracking, unknown_call_ids=remaining)
            else:
                # Every outcome is known again: the turn waits for a new owner.
                _advance_turn(rows, event, tracking, TurnState.RUNNING, unknown_call_ids=[])

    @process_event.register
    def _(self, event: Session.TurnCancelled, tracking: Tracking) -> None:
        with self.view.change(event, tracking) as rows:
            _advance_turn(rows, event, tracking, TurnState.CANCELLED, unknown_call_ids=[])

    @process_event.register
    def _(self, event: Session.ToolCallProposed, tracking: Tracking) -> None:
        with self.view.change(event, tracking) as rows:
            _advance_turn(rows, event, tracking, TurnState.AWAITING_APPROVAL)

    @process_event.register(Session.ToolCallApproved)
    @process_event.register(Session.ToolCallRejected)
    def _(self, event: Any, tracking: Tracking) -> None:
        # Calls are proposed one at a time: once decided, the turn runs again.
        with self.view.change(event, tracking) as rows:
            _advance_turn(rows, event, tracking, TurnState.RUNNING)

    @process_event.register
    def _(self, event: Session.Closed, tracking: Tracking) -> None:
        with self.view.change(event, tracking) as rows:
            _advance(rows, event, tracking, closed=True)


def _started(event: Session.Started, tracking: Tracking) -> Row:
    return {
        "session_id": event.originator_id,
        "title": event.title,
        "status": status_of(False, None),
        "closed": False,
        "turn_count": 0,
        "last_turn_id": None,
        "last_turn_state": None,
        "unknown_call_ids": [],
        "created_by": event.created_by,
        "created_at": event.timestamp,
        "last_activity_at": event.timestamp,
        "last_position": tracking.notification_id,
        "version": event.originator_version,
        "metadata": dict(event.metadata),
        "forked_from": None,
    }


def _like_escaped(text: str) -> str:
    """``text`` as a LIKE pattern matching it literally (its wildcards escaped)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _advance(rows: Rows, event: Any, tracking: Tracking, **changes: Any) -> None:
    """Apply ``changes`` to the session's row; activity, position and version always move."""
    row = rows.get((event.originator_id,))
    if row is None:
        return  # an event before its session started: nothing to show it on
    row = {
        **row,
        **changes,
        "last_activity_at": event.timestamp,
        "last_position": tracking.notification_id,
        "version": event.originator_version,
    }
    row["status"] = status_of(row["closed"], row["last_turn_state"])
    rows.put(row)


def _advance_turn(
    rows: Rows, event: Any, tracking: Tracking, state: TurnState, **changes: Any
) -> None:
    """Move the last turn to ``state`` (if the event is about the last turn)."""
    row = rows.get((event.originator_id,))
    if row is not None and row["last_turn_id"] == event.turn_id:
        changes["last_turn_state"] = state.value
    else:
        changes = {}
    _advance(rows, event, tracking, **changes)
