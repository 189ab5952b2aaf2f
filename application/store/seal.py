"""Sealed snapshots: each names its stream's chain head and carries a digest of itself.

A snapshot is a cache of state the events already hold, and the next load
trusts it: a snapshot edited in the database would change what the runtime
allows (a policy, a pending call, a counter). So every snapshot row is sealed
when it is stored, in the same insert statement:

- ``chain_head``: the stored hash of the stream's event at the snapshot's
  version (``application.store.chain``), read by the insert itself; NULL when
  that event is unchained;
- ``digest``: ``sha256(chain_head ‖ int8(version) ‖ topic ‖ 0x00 ‖ state)``
  over the bytes exactly as stored (``chain_head`` empty when NULL).

Loading reads each snapshot row together with the current hash of the event
at its version (one statement, a join) and uses it only when its digest
matches its bytes and its named head is that event's hash. Otherwise a
warning is logged (the session and version, never the state) and the
snapshot is ignored: the session is replayed from its events, so an edited
snapshot never changes what the runtime allows.

A snapshot that names no head while the event at its version has a hash was
taken before its stream was chained (``turnlog audit --chain-existing`` came
later); its digest still proves its bytes, and it is used. Rows stored before
snapshots were sealed have neither column (NULL): they keep loading, and
``turnlog audit --verify`` reports them as unsealed. The digest is no
signature: someone who can write the table can also recompute it. What
proves a snapshot is the comparison ``audit --verify`` makes with a replay of
the events up to its version (``projections.snapshot_audit``).

Being a cache, a snapshot's commit does not wait for the disk (``chain.RIDING``):
a crash of the database may lose it, and the next load replays from an older one.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any
from uuid import UUID

from eventsourcing.persistence import InterfaceError as PersistenceInterfaceError
from eventsourcing.persistence import OperationalError as PersistenceOperationalError
from eventsourcing.persistence import StoredEvent
from eventsourcing.postgres import PostgresAggregateRecorder, PostgresDatastore
from eventsourcing.utils import retry
from psycopg import OperationalError
from psycopg.errors import DuplicateObject
from psycopg.sql import SQL, Composable, Composed, Identifier, Literal

from turnlog.application.errors import SchemaNotReady
from turnlog.application.store import finished_chunks
from turnlog.application.store.arrays import Blobs, Integers, Texts, Uuids
from turnlog.application.store.chain import RIDING
from turnlog.application.store.logorder import table

log = logging.getLogger("turnlog.snapshots")

SEPARATOR = b"\x00"
SCHEMA_LOCK_TIMEOUT = "5s"
UNSEALED = "unsealed"
FALLBACK = 2  # older snapshots read too, for when the latest one's seal fails


def events_table_of(snapshots_table: str) -> str:
    """The events table whose streams a snapshots table caches (``x_snapshots``: ``x_events``)."""
    return snapshots_table.removesuffix("_snapshots") + "_events"


def snapshots_table_of(events_table: str) -> str:
    return events_table.removesuffix("_events") + "_snapshots"


def digest(chain_head: bytes | None, version: int, topic: str, state: bytes) -> bytes:
    """The digest a snapshot row carries (the insert computes the same in SQL)."""
    return hashlib.sha256(
        (chain_head or b"")
        + version.to_bytes(8, "big", signed=True)
        + topic.encode("utf-8")
        + SEPARATOR
        + state
    ).digest()


@dataclass(frozen=True)
class SealedRow:
    """One stored snapshot, its seal, and the current hash of the event at its version."""

    session_id: UUID
    version: int
    topic: str
    state: bytes
    chain_head: bytes | None
    digest: bytes | None
    event_hash: bytes | None
    event_exists: bool
    # The state with its chunked entries back in (``finished_chunks``); None: as stored.
    whole_state: bytes | None = None

    @property
    def stored(self) -> StoredEvent:
        state = self.state if self.whole_state is None else self.whole_state
        return StoredEvent(self.session_id, self.version, self.topic, state)

    def verdict(self) -> str:
        """Empty when the seal holds; ``UNSEALED``; else why the snapshot must not be used."""
        if self.chain_head is None and self.digest is None:
            return UNSEALED
        if not self.event_exists:
            return f"the stream has no event at version {self.version}"
        if self.digest != digest(self.chain_head, self.version, self.topic, self.state):
            return "its digest does not match its stored bytes (the row was changed)"
        if self.chain_head is not None and self.chain_head != self.event_hash:
            stored = self.event_hash.hex() if self.event_hash else "none"
            return (
                f"it names chain head {self.chain_head.hex()}, the event at version"
                f" {self.version} has hash {stored}"
            )
        return ""


def _column_statement(schema: str, snapshots_table: str, column: str) -> Composed:
    """Add a nullable seal column when it is missing (stored rows are not rewritten)."""
    return SQL(
        "DO $SEAL$ BEGIN"
        " IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = {regclass}::regclass"
        "   AND attname = {name} AND NOT attisdropped) THEN"
        "   ALTER TABLE {table} ADD COLUMN {column} bytea;"
        " END IF;"
        " END $SEAL$"
    ).format(
        regclass=Literal(f"{_quoted(schema)}.{_quoted(snapshots_table)}"),
        name=Literal(column),
        table=table(schema, snapshots_table),
        column=Identifier(column),
    )


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


_READY = SQL(
    "SELECT to_regclass(%(table)s) IS NOT NULL AS exists,"
    " (SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass(%(table)s)"
    "  AND attname IN ('chain_head', 'digest') AND NOT attisdropped) = 2"
    " AND to_regclass(%(chunks)s) IS NOT NULL AS ready"
)
_LOCK_TIMEOUT = SQL("SELECT set_config('lock_timeout', %s, true)")


def select_statement(schema: str, snapshots_table: str) -> Composable:
    """A stream's snapshot rows with their seals and the hash of the event at each version."""
    return SQL(
        "SELECT s.originator_id, s.originator_version, s.topic, s.state, s.chain_head,"
        " s.digest, e.hash AS event_hash, e.originator_version IS NOT NULL AS event_exists"
        " FROM {s} s LEFT JOIN {e} e ON e.originator_id = s.originator_id"
        " AND e.originator_version = s.originator_version WHERE s.originator_id = %s"
    ).format(s=table(schema, snapshots_table), e=table(schema, events_table_of(snapshots_table)))


def sealed_row(row: Any) -> SealedRow:
    def optional(value: Any) -> bytes | None:
        return None if value is None else bytes(value)

    return SealedRow(
        row["originator_id"],
        int(row["originator_version"]),
        row["topic"],
        bytes(row["state"]),
        optional(row["chain_head"]),
        optional(row["digest"]),
        optional(row["event_hash"]),
        bool(row["event_exists"]),
    )


def read_rows(conn: Any, schema: str, snapshots_table: str, session_id: UUID) -> list[SealedRow]:
    """Every snapshot row of a stream, in version order (for the audit)."""
    statement = select_statement(schema, snapshots_table) + SQL(" ORDER BY s.originator_version")
    rows = [sealed_row(r) for r in conn.execute(statement, [session_id]).fetchall()]
    with conn.cursor() as curs:
        whole = finished_chunks.splice(
            curs, schema, snapshots_table, session_id, [r.stored for r in rows]
        )
    # A snapshot whose chunks do not prove out keeps its stored state (and so
    # differs from the replay in the audit).
    return [
        r if w is None or w.state is r.state else replace(r, whole_state=w.state)
        for r, w in zip(rows, whole, strict=True)
    ]


class SnapshotRecorder(PostgresAggregateRecorder):
    """The library's snapshots recorder, sealing each row it stores and checking each it loads."""

    def __init__(
        self, datastore: PostgresDatastore, *, events_table_name: str = "stored_snapshots"
    ) -> None:
        super().__init__(datastore, events_table_name=events_table_name)
        schema = self.datastore.schema
        for column in ("chain_head", "digest"):
            self.sql_create_statements.append(
                _column_statement(schema, self.events_table_name, column)
            )
        self.sql_create_statements.append(
            finished_chunks.create_statement(schema, self.events_table_name)
        )
        events = table(schema, events_table_of(self.events_table_name))
        self._insert = SQL(
            "INSERT INTO {s} (originator_id, originator_version, topic, state, chain_head, digest)"
            " SELECT u.i, u.v, u.t, u.s, e.hash, sha256(coalesce(e.hash, ''::bytea)"
            "  || int8send(u.v) || convert_to(u.t, 'UTF8') || decode('00', 'hex') || u.s)"
            " FROM unnest(%s::uuid[], %s::bigint[], %s::text[], %s::bytea[]) AS u(i, v, t, s)"
            " LEFT JOIN {e} e ON e.originator_id = u.i AND e.originator_version = u.v{riding}"
        ).format(s=table(schema, self.events_table_name), e=events, riding=RIDING)
        self._select = select_statement(schema, self.events_table_name)

    def create_table(self) -> None:
        """Create the tables (snapshots, their chunks), or add the seal's columns to older ones."""
        schema = self.datastore.schema
        name = f"{_quoted(schema)}.{_quoted(self.events_table_name)}"
        chunks = (
            f"{_quoted(schema)}.{_quoted(finished_chunks.chunks_table_of(self.events_table_name))}"
        )
        with self.datastore.transaction(commit=False) as curs:
            curs.execute(_READY, {"table": name, "chunks": chunks})
            row = curs.fetchone()
        if row is not None and row["ready"]:
            self.datastore.register_type_adapters()
            return
        if (
            row is not None
            and row["exists"]
            and not getattr(self.datastore, "turnlog_owns_schema", True)
        ):
            raise SchemaNotReady(
                f"{name} was written by an older version and must be migrated:"
                " run `turnlog db init` (or start serve); nothing was changed"
            )
        for statement in self.sql_create_statements:
            if "CREATE TYPE" in statement.as_string():  # no IF NOT EXISTS for types
                with (
                    self.datastore.transaction(commit=True) as curs,
                    contextlib.suppress(DuplicateObject),
                ):
                    curs.execute(statement, prepare=False)
        try:
            with self.datastore.transaction(commit=True) as curs:
                curs.execute(_LOCK_TIMEOUT, [SCHEMA_LOCK_TIMEOUT])
                self._create_table(curs)
        except (OperationalError, PersistenceOperationalError) as exc:
            cause = exc if isinstance(exc, OperationalError) else exc.__cause__
            if getattr(cause, "sqlstate", None) != "55P03":  # lock_not_available
                raise
            raise SchemaNotReady(
                f"{name} must be migrated but a transaction holds it"
                f" (waited {SCHEMA_LOCK_TIMEOUT}); nothing was changed: start again"
            ) from None
        self.datastore.register_type_adapters()

    @retry((PersistenceInterfaceError, PersistenceOperationalError), max_attempts=10, wait=0.2)
    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        if not stored_events:
            return None
        if not any(finished_chunks.may_chunk(e) for e in stored_events):
            with self.datastore.get_connection() as conn, conn.cursor() as curs:
                curs.execute(self._insert, self._params(stored_events))
            return None
        schema, name = self.datastore.schema, self.events_table_name
        with self.datastore.get_connection() as conn, conn.transaction(), conn.cursor() as curs:
            # Older entries go to chunks in the same transaction as the row naming them.
            stripped = [finished_chunks.strip(curs, schema, name, e) for e in stored_events]
            curs.execute(self._insert, self._params(stripped))
        return None

    @staticmethod
    def _params(stored_events: Sequence[StoredEvent]) -> tuple[list[Any], ...]:
        return (
            Uuids([e.originator_id for e in stored_events]),
            Integers([e.originator_version for e in stored_events]),
            Texts([e.topic for e in stored_events]),
            Blobs([e.state for e in stored_events]),
        )

    @retry((PersistenceInterfaceError, PersistenceOperationalError), max_attempts=10, wait=0.2)
    def select_events(
        self,
        originator_id: UUID | str,
        *,
        gt: int | None = None,
        lte: int | None = None,
        desc: bool = False,
        limit: int | None = None,
    ) -> Sequence[StoredEvent]:
        """The stream's snapshots whose seal holds (or that were stored unsealed)."""
        statement: Composable = self._select
        params: list[Any] = [originator_id]
        if gt is not None:
            statement += SQL(" AND s.originator_version > %s")
            params.append(gt)
        if lte is not None:
            statement += SQL(" AND s.originator_version <= %s")
            params.append(lte)
        statement += SQL(" ORDER BY s.originator_version") + SQL(" DESC" if desc else " ASC")
        if limit is not None:
            # A few more than asked: one whose seal fails gives way to an older one.
            statement += SQL(" LIMIT %s")
            params.append(limit + FALLBACK)
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            curs.execute(statement, params, prepare=True)
            rows = [sealed_row(r) for r in curs.fetchall()]
            kept: list[StoredEvent] = []
            for row in rows:
                verdict = row.verdict()
                if verdict and verdict != UNSEALED:
                    self._ignored(row, verdict)
                    continue
                kept.append(row.stored)
                if limit is not None and len(kept) == limit:
                    break
            whole = finished_chunks.splice(
                curs, self.datastore.schema, self.events_table_name, UUID(str(originator_id)), kept
            )
        for stored, spliced in zip(kept, whole, strict=True):
            if spliced is None:
                log.warning(
                    "snapshot of session %s at version %d ignored, its chunks of finished"
                    " turns are missing or changed: the session is replayed from its events",
                    stored.originator_id,
                    stored.originator_version,
                )
        return [s for s in whole if s is not None]

    @staticmethod
    def _ignored(row: SealedRow, verdict: str) -> None:
        log.warning(
            "snapshot of session %s at version %d ignored, its seal does not hold"
            " (%s): the session is replayed from its events; run"
            " `turnlog audit %s --verify`",
            row.session_id,
            row.version,
            verdict,
            row.session_id,
        )
