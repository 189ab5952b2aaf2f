"""A read model's rows as plain dicts, and the working set one batch of events changes.

Every read model is a fold of the event log into rows. The fold itself (the
projection's handlers) only ever touches a ``Rows`` object in memory: the
Postgres view loads the rows a batch can touch, lets the handlers change them,
and writes the changes back with the tracking position in one transaction;
the in-memory view keeps all rows (verify and audit use it). Both therefore
run exactly the same handler code.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

Key = tuple[Any, ...]
Row = dict[str, Any]

SUMMARY_CHARS = 200

# PostgreSQL text cannot hold NUL, but an event may (a title, a tool's result,
# a model's tool name: JSON carries it). A row value with NUL would fail its
# batch on every retry and stop the read model for good, so every text a row
# holds is made storable here, in the fold itself: the Postgres view and the
# in-memory reference fold then agree, and audit compares against the same.
NUL_REPLACEMENT = "\ufffd"


@dataclass(frozen=True)
class Table:
    """A read model's table: typed columns, primary key, and how events map to rows.

    ``scope`` names the columns a batch loads rows by (a prefix of what an
    event knows: its session, and its turn where it has one); ``scope_of``
    gives an event's scope key, or None when the event touches no row.
    """

    columns: tuple[tuple[str, str], ...]  # (name, SQL type): types are fixed SQL text
    key: tuple[str, ...]
    scope: tuple[str, ...]
    scope_of: Callable[[Any], Key | None]
    indexes: tuple[tuple[str, ...], ...] = field(default=())

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.columns)

    def sql_type(self, column: str) -> str:
        return dict(self.columns)[column]

    def key_of(self, row: Row) -> Key:
        return tuple(row[c] for c in self.key)

    def scope_key(self, row: Row) -> Key:
        return tuple(row[c] for c in self.scope)


class Rows:
    """Rows by primary key, with the changes made since they were loaded."""

    def __init__(self, table: Table, rows: Iterable[Row] = ()) -> None:
        self.table = table
        self._rows: dict[Key, Row] = {}
        self._scopes: dict[Key, dict[Key, None]] = {}  # an ordered set of keys per scope
        self._changed: dict[Key, Row | None] = {}  # None: deleted
        for row in rows:
            self._index(dict(row))

    def get(self, key: Key) -> Row | None:
        return self._rows.get(storable_key(key))

    def in_scope(self, scope: Key) -> list[Row]:
        """The rows of one scope (e.g. every tool call of a turn), in insertion order."""
        return [self._rows[k] for k in self._scopes.get(storable_key(scope), {})]

    def all(self) -> list[Row]:
        return list(self._rows.values())

    def put(self, row: Row) -> None:
        """Insert a row, or replace the row with the same key (its texts made storable)."""
        row = {name: storable(value) for name, value in row.items()}
        self._index(row)
        self._changed[self.table.key_of(row)] = row

    def update(self, key: Key, **changes: Any) -> Row | None:
        """Change some columns of a row; None (and no change) when there is no such row."""
        row = self._rows.get(storable_key(key))
        if row is None:
            return None
        new = {**row, **changes}
        self.put(new)
        return new

    def delete(self, key: Key) -> None:
        key = storable_key(key)
        row = self._rows.pop(key, None)
        if row is None:
            return
        self._scopes.get(self.table.scope_key(row), {}).pop(key, None)
        self._changed[key] = None

    def pending(self) -> tuple[list[Row], list[Key]]:
        """(rows to upsert, keys to delete) since loading or the last ``clear_pending``."""
        upserts = [row for row in self._changed.values() if row is not None]
        deletes = [key for key, row in self._changed.items() if row is None]
        return upserts, deletes

    def clear_pending(self) -> None:
        self._changed.clear()

    def _index(self, row: Row) -> None:
        key = self.table.key_of(row)
        self._rows[key] = row
        self._scopes.setdefault(self.table.scope_key(row), {})[key] = None


def storable(value: Any) -> Any:
    """``value`` as a PostgreSQL text, text[] or jsonb column can hold it: NUL replaced.

    jsonb refuses ``\\u0000`` in any string, keys included, so a dict (a
    session's metadata) is made storable all the way down.
    """
    if isinstance(value, str):
        return value.replace("\x00", NUL_REPLACEMENT) if "\x00" in value else value
    if isinstance(value, list):
        return [storable(v) for v in value]
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    return value


def storable_key(key: Key) -> Key:
    """A key as the rows hold it (ids from events may carry NUL too)."""
    # Every row lookup asks: the key itself unless a part needs replacing.
    for part in key:
        if isinstance(part, str) and "\x00" in part:
            return tuple(storable(p) for p in key)
    return key if isinstance(key, tuple) else tuple(key)


def summarize(value: Any, limit: int = SUMMARY_CHARS) -> str:
    """A short text for a tool result or error: JSON for data, cut at ``limit`` characters."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def seconds_between(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return (end - start).total_seconds()


def as_json(row: Row) -> dict[str, Any]:
    """A row as JSON-able values: UUIDs and timestamps as strings."""
    return {name: _plain(value) for name, value in row.items()}


def _plain(value: Any) -> Any:
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def session_scope(event: Any) -> Key | None:
    """The rows of an event's session."""
    return (event.originator_id,)


def turn_scope(event: Any) -> Key | None:
    """The rows of an event's turn; None for session-level events (started, closed)."""
    turn_id = getattr(event, "turn_id", None)
    return None if turn_id is None else (event.originator_id, turn_id)
