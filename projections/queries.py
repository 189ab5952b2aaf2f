"""Queries over the read models: what the HTTP API and the CLI read.

Lists are keyset-paginated. A cursor is an opaque string (base64 of the
last row's sort key, tagged with the list it belongs to); anything that is
not a cursor this list handed out is refused as ``InvalidCursor`` (422).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import time
from collections.abc import Callable, Sequence
from typing import Any
from uuid import UUID

from psycopg import sql

from turnlog.application.errors import InvalidCursor, InvalidQuery
from turnlog.application.sessions import Sessions
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database
from turnlog.application.store.logorder import Place
from turnlog.projections import open_turns, sessions_view, tool_calls
from turnlog.projections.catalog import READ_MODELS, read_models
from turnlog.projections.log import EventLog, create_tables
from turnlog.projections.rows import Key, Row, as_json
from turnlog.projections.status import projection_status

MAX_LIMIT = 500
LAST_TURN_STATES = ("queued", "running", "interrupted", "completed", "failed", "abandoned")
MAX_CURSOR_CHARS = 512
MAX_SEARCH_CHARS = 200  # of a session search's text, and of a metadata filter's key or value
MAX_METADATA_FILTERS = 20
WAIT_POLL_SECONDS = 0.02

Page = tuple[list[dict[str, Any]], str | None]


class ReadModels:
    """The read models of one namespace: lists, read-your-writes waits and status.

    They read through the process's ``sessions`` application (its connection
    pool). Safe to share between threads.
    """

    def __init__(self, db: Database, settings: Settings, *, sessions: Sessions):
        self.db = db
        self.settings = settings
        self.events = EventLog(sessions)
        create_tables(db, self.events, read_models())
        datastore = self.events.datastore
        self._sessions = sessions_view.PostgresSessionsView(
            datastore, tracking_table_name=READ_MODELS["sessions"].tracking_table
        )
        self._open_turns = open_turns.PostgresOpenTurnsView(
            datastore, tracking_table_name=READ_MODELS["open_turns"].tracking_table
        )
        self._tool_calls = tool_calls.PostgresToolCallsView(
            datastore, tracking_table_name=READ_MODELS["tool_calls"].tracking_table
        )

    def list_sessions(
        self,
        status: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        last_turn_state: str | None = None,
        search: str | None = None,
        metadata: Sequence[tuple[str, str]] = (),
        forked_from: str | UUID | None = None,
    ) -> Page:
        """Sessions, newest activity first; ``status``: idle, busy, blocked or closed;
        ``last_turn_state``: how (or whether) their last turn ended, e.g. failed;
        ``search``: whose id or title starts with it (case-insensitive, at most 200
        characters); ``metadata``: (key, value) pairs its metadata must all hold;
        ``forked_from``: only the forks of that session (which hold copies of its turns)."""
        _check_choice("status", status, sessions_view.STATUSES)
        _check_choice("last_turn_state", last_turn_state, LAST_TURN_STATES)
        limit = _check_limit(limit)
        text = _check_search(search)
        wanted = _metadata_filters(metadata)
        source = _check_uuid(forked_from, "forked_from") if forked_from else None
        after = decode_cursor(cursor, "sessions", (int,))
        rows = self._sessions.list_sessions(
            status, limit + 1, after[0] if after else None, last_turn_state, text, wanted, source
        )
        return _page(rows, limit, "sessions", lambda r: (r["last_position"],))

    def search_sessions(self, text: str, limit: int = 50) -> list[dict[str, Any]]:
        """Sessions whose id starts with ``text`` or whose title contains it, newest first."""
        text = _check_text("search", text.strip())
        return [as_json(r) for r in self._sessions.search(text, _check_limit(limit))]

    def list_open_turns(
        self, state: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> Page:
        """Open turns, oldest first; ``state``: queued, running or interrupted."""
        _check_choice("state", state, open_turns.STATES)
        limit = _check_limit(limit)
        after = decode_cursor(cursor, "open_turns", (int,))
        rows = self._open_turns.list_open_turns(state, limit + 1, after[0] if after else None)
        return _page(rows, limit, "open_turns", lambda r: (r["submitted_position"],))

    def count_open_turns(self, state: str | None = None) -> int:
        """How many turns are open (in ``state``, if given)."""
        _check_choice("state", state, open_turns.STATES)
        return self._open_turns.count({"state": state} if state else {})

    def count_sessions(self) -> int:
        """How many sessions the namespace holds (closed ones too, purged ones not)."""
        return self._sessions.count({})

    def list_tool_calls(
        self,
        status: str | None = None,
        session_id: str | UUID | None = None,
        tool: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> Page:
        """Tool calls, most recently requested first, filtered by state, session and tool."""
        _check_choice("status", status, tool_calls.STATES)
        limit = _check_limit(limit)
        filters: dict[str, Any] = {}
        if status:
            filters["state"] = status
        if session_id:
            filters["session_id"] = _check_uuid(session_id)
        if tool:
            filters["tool"] = _check_text("tool", tool)
        after = decode_cursor(cursor, "tool_calls", (int, str))
        rows = self._tool_calls.list_tool_calls(
            filters, limit + 1, (after[0], after[1]) if after else None
        )
        return _page(rows, limit, "tool_calls", lambda r: (r["requested_position"], r["call_id"]))

    def positions(self, names: Sequence[str] | None = None) -> dict[str, int]:
        """Each read model's position: of the last event it processed (0 before the first)."""
        return {name: place.position for name, place in self.places(names).items()}

    def places(self, names: Sequence[str] | None = None) -> dict[str, Place]:
        """Each read model's place in the log's order (the start before its first batch)."""
        models = read_models(names)
        statement = sql.SQL("SELECT {}").format(
            sql.SQL(", ").join(
                sql.SQL(
                    "(SELECT ARRAY[coalesce(xact_id, '0'::xid8)::text, notification_id::text]"
                    " FROM {}.{} WHERE application_name = %s) AS {}"
                ).format(
                    sql.Identifier(self.events.schema),
                    sql.Identifier(m.tracking_table),
                    sql.Identifier(m.name),
                )
                for m in models
            )
        )
        params = [self.events.application_name] * len(models)
        with self.events.datastore.get_connection() as conn:
            row = conn.execute(statement, params).fetchone()
        values = list(row.values()) if isinstance(row, dict) else list(row or ())
        return {
            m.name: Place(int(v[0]), int(v[1])) if v else Place.start()
            for m, v in zip(models, values, strict=True)
        }

    def wait_for(
        self, position: int | None, timeout: float, names: list[str] | None = None
    ) -> bool:
        """Wait (at most ``timeout`` s) until the read models have processed ``position``.

        ``position`` names an event (a write's position); it is reached when
        a read model's place is at or past that event's place in the log's
        order, so every event before it has been processed too. Every event
        is tracked, so any event is reached once processed. Returns False on
        timeout; never raises for a slow runner. ``InvalidPosition`` when no
        event of this log has that position.
        """
        if position is None or position <= 0:
            return True
        read_models(names)  # unknown names are refused before waiting
        target = self.events.place_of(position)
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            if min(self.places(names).values()) >= target:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(WAIT_POLL_SECONDS, remaining))

    def status(self, names: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Each read model's position, the log head, lag, and whether a runner holds it."""
        return projection_status(self.events, self.settings.namespace, read_models(names))


def encode_cursor(kind: str, key: Key) -> str:
    raw = json.dumps([kind, *key], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_cursor(cursor: str | None, kind: str, types: tuple[type, ...]) -> Key | None:
    """The sort key a cursor carries; None for no cursor; InvalidCursor for anything else."""
    if cursor is None or cursor == "":
        return None
    refused = InvalidCursor(f"cursor {cursor[:40]!r} is not a cursor of this list")
    if not isinstance(cursor, str) or len(cursor) > MAX_CURSOR_CHARS:
        raise refused
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = json.loads(raw)
    except (ValueError, binascii.Error, UnicodeError):
        raise refused from None
    if not isinstance(data, list) or len(data) != len(types) + 1 or data[0] != kind:
        raise refused
    values = tuple(data[1:])
    for value, expected in zip(values, types, strict=True):
        if not isinstance(value, expected) or isinstance(value, bool):
            raise refused
        if isinstance(value, str) and "\x00" in value:
            raise refused  # PostgreSQL text cannot hold it: not a cursor this list gave
        if isinstance(value, int) and not -(2**63) <= value < 2**63:
            raise refused  # positions are bigint
    return values


def _page(rows: list[Row], limit: int, kind: str, key: Callable[[Row], Key]) -> Page:
    items = rows[:limit]
    following = encode_cursor(kind, key(items[-1])) if len(rows) > limit and items else None
    return [as_json(r) for r in items], following


def _check_limit(limit: int) -> int:
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidQuery(f"limit must be an integer from 1 to {MAX_LIMIT}")
    return limit


def _check_choice(what: str, value: str | None, choices: Sequence[str]) -> None:
    if value is not None and value != "" and value not in choices:
        raise InvalidQuery(f"{what} must be one of {', '.join(choices)}; got {value!r}")


def _check_text(what: str, value: str) -> str:
    # PostgreSQL text cannot hold NUL: such a filter is malformed, not a server error.
    if "\x00" in value:
        raise InvalidQuery(f"{what} must not contain NUL characters")
    return value


def _check_uuid(value: str | UUID, what: str = "session_id") -> UUID:
    if isinstance(value, UUID):
        return value
    try:
        return UUID(str(value))
    except ValueError:
        raise InvalidQuery(f"{what} {value!r} is not a valid id") from None


def _check_search(search: str | None) -> str:
    text = _check_text("search", (search or "").strip())
    if len(text) > MAX_SEARCH_CHARS:
        raise InvalidQuery(f"search must be at most {MAX_SEARCH_CHARS} characters")
    return text


def _metadata_filters(pairs: Sequence[tuple[str, str]]) -> list[tuple[str, list[Any]]]:
    """Each (key, value) filter with the JSON values it matches: the text, and the number,
    boolean or null it spells (``n=5`` finds ``{"n": 5}`` and ``{"n": "5"}``)."""
    if len(pairs) > MAX_METADATA_FILTERS:
        raise InvalidQuery(f"at most {MAX_METADATA_FILTERS} metadata filters")
    found: list[tuple[str, list[Any]]] = []
    for key, value in pairs:
        _check_text("a metadata key", key)
        _check_text("a metadata value", value)
        if not key or len(key) > MAX_SEARCH_CHARS or len(value) > MAX_SEARCH_CHARS:
            raise InvalidQuery(
                f"a metadata filter's key must be 1 to {MAX_SEARCH_CHARS} characters and its"
                f" value at most {MAX_SEARCH_CHARS}"
            )
        values: list[Any] = [value]
        try:
            spelled = json.loads(value)
        except ValueError:
            spelled = value
        finite = not isinstance(spelled, float) or math.isfinite(spelled)
        if (spelled is None or isinstance(spelled, bool | int | float)) and finite:
            values.append(spelled)
        found.append((key, values))
    return found
