"""Leases: who owns a session's open turn right now.

A lease is a PostgreSQL session-level advisory lock keyed by (namespace,
session), held on a connection of its own. When the owning process dies,
the server drops its connection and with it the lock, at once: "the lock is
free" means "the owner is gone". The lease only says who may act; every
write is still fenced by the turn's claim number and optimistic concurrency.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import psycopg

from turnlog.application.database import Database, connect, lock_key
from turnlog.application.errors import LeaseLost

# A bigint advisory key shows in pg_locks as classid (high half) and objid
# (low half), with objsubid 1.
_HELD = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    " AND classid::bigint = %s AND objid::bigint = %s AND objsubid = 1"
)


def _key_parts(key: int) -> tuple[int, int]:
    return (key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF


def session_lock_key(namespace: str, session_id: UUID | str) -> int:
    return lock_key("turnlog:lease", namespace, str(session_id))


class Lease:
    """An advisory lock on one session, held on a dedicated connection."""

    def __init__(self, conn: psycopg.Connection[Any], namespace: str, session_id: UUID) -> None:
        self._conn = conn
        self.namespace = namespace
        self.session_id = session_id
        self.key = session_lock_key(namespace, session_id)

    @classmethod
    def try_acquire(cls, db: Database, namespace: str, session_id: UUID) -> Lease | None:
        """Take the lease if nobody holds it; None when a live owner has it."""
        conn = connect(db)
        key = session_lock_key(namespace, session_id)
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
        if row is None or not row[0]:
            conn.close()
            return None
        return cls(conn, namespace, session_id)

    def check(self) -> None:
        """Raise LeaseLost unless the lock is still ours; call before any side effect."""
        try:
            row = self._conn.execute(
                _HELD + " AND pid = pg_backend_pid()", _key_parts(self.key)
            ).fetchone()
        except psycopg.Error as exc:
            raise LeaseLost(f"lease on session {self.session_id} lost: {exc}") from None
        if not row or not row[0]:
            raise LeaseLost(f"lease on session {self.session_id} is no longer held")

    def release(self) -> None:
        """Give the lease up (closing the connection drops the lock either way)."""
        try:
            if not self._conn.closed:
                self._conn.execute("SELECT pg_advisory_unlock(%s)", (self.key,))
        except psycopg.Error:
            pass
        finally:
            self._conn.close()

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def owner_alive(conn: psycopg.Connection[Any], namespace: str, session_id: UUID) -> bool:
    """True when some live connection holds the session's lease (read-only check)."""
    key = session_lock_key(namespace, session_id)
    row = conn.execute(_HELD, _key_parts(key)).fetchone()
    return bool(row and row[0])
