"""Leases: who owns a session's open turn right now.

A lease is a PostgreSQL session-level advisory lock keyed by (namespace,
session), held on a connection of its own. When the owning process dies,
the server drops its connection and with it the lock, at once: "the lock is
free" means "the owner is gone". The lease only says who may act; every
write is still fenced by the turn's claim number and optimistic concurrency.

**Lease loss is not death.** The server may drop a live owner's connection
(an administrator's ``pg_terminate_backend``, an idle-connection reaper, a
failover), and with it the lock, while the owner's tool call is still
running. Left alone, another worker would take the turn over and interrupt
a call whose result is about to arrive. So a process watches its leases'
connections (one thread, ``_Keeper``) and, the moment one is dropped, takes
the lock back on a new connection and asks its owner whether the turn is
still its own (``Lease.guard``: the claim number in the session is still the
owner's). Still its own: the owner carries on and records its result.
Someone else's lock, or someone else's claim meanwhile: the lease is lost for
good, and the owner stops without writing (``check`` raises ``LeaseLost``).

**Connections are kept.** A process takes its leases through one ``Leases``
pool: a released lease unlocks and leaves its connection idle for the next
one, so taking a lease costs one statement, not a new server connection. An
idle connection that died meanwhile is replaced on the spot.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn
from uuid import UUID

import psycopg

from turnlog.application.errors import ApplicationError, LeaseLost
from turnlog.application.store.database import Database, advisory_lock_holder, connect, lock_key

log = logging.getLogger("turnlog.leases")

RETAKE_INTERVAL = 0.5  # seconds between attempts to take a dropped lease back (server down)
RETAKE_PATIENCE = 60.0  # seconds a step waits for its dropped lease before giving the turn up
RETAKE_CONNECT_TIMEOUT = 2  # seconds (libpq's connect_timeout: whole seconds)


def session_lock_key(namespace: str, session_id: UUID | str) -> int:
    return lock_key("turnlog:lease", namespace, str(session_id))


class Lease:
    """An advisory lock on one session, held on a dedicated connection, taken back if dropped."""

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        namespace: str,
        session_id: UUID,
        db: Database,
        pool: Leases | None = None,
    ) -> None:
        self._conn = conn
        self._db = db
        self._pool = pool
        self.namespace = namespace
        self.session_id = session_id
        self.key = session_lock_key(namespace, session_id)
        self.retaken = 0  # times the lock was taken back after its connection was dropped
        self._lock = threading.Lock()  # one user of the connection at a time
        self._lost = ""  # why the lease is gone for good ('' while held or being taken back)
        self._unverified = False  # taken back, the owner not yet asked whether it is still its
        self._still_ours: Callable[[], bool] | None = None
        _keeper.watch(self)

    def guard(self, still_ours: Callable[[], bool] | None) -> None:
        """Ask ``still_ours`` (the owner: is the turn's claim still mine?) after a retake."""
        with self._lock:
            self._still_ours = still_ours

    def check(self) -> None:
        """Raise LeaseLost unless the lock is ours; call before any side effect or result.

        A dropped lock is taken back here if the watcher has not done it yet;
        while the server cannot be reached this waits up to ``RETAKE_PATIENCE``.
        """
        deadline = time.monotonic() + RETAKE_PATIENCE
        while True:
            with self._lock:
                if self._ensure():
                    return
            if time.monotonic() >= deadline:
                raise LeaseLost(
                    f"lease on session {self.session_id} lost with its connection and not"
                    f" taken back within {RETAKE_PATIENCE:.0f} s (server unreachable)"
                )
            time.sleep(RETAKE_INTERVAL)

    def release(self) -> None:
        """Give the lease up (closing the connection drops the lock either way)."""
        _keeper.forget(self)
        with self._lock:
            self._lost = self._lost or "released"
            unlocked = False
            try:
                if not self._conn.closed:
                    row = self._conn.execute(
                        "SELECT pg_advisory_unlock(%s)", (self.key,)
                    ).fetchone()
                    unlocked = bool(row and row[0])
            except psycopg.Error:
                pass
            if unlocked and self._pool is not None:
                self._pool.put_back(self._conn)  # unlocked: clean for the next lease
            else:
                self._conn.close()

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # ----------------------------------------------------------- taking back

    def _ensure(self) -> bool:
        """Held and still the owner's: True; not known yet (server down): False.

        Raises LeaseLost when another process holds the lock or claimed the
        turn meanwhile. Called with ``_lock`` held.
        """
        if self._lost:
            raise LeaseLost(f"lease on session {self.session_id} lost: {self._lost}")
        if not self._holds():
            if not self._take_back():
                return False
            self._unverified = True
        if self._unverified:
            if not self._verify():
                return False
            self._unverified = False
            self.retaken += 1
            log.warning(
                "lease on session %s taken back after its connection was dropped; the turn is"
                " still this process's",
                self.session_id,
            )
        return True

    def _holds(self) -> bool:
        """Whether the lock is still held: its connection's server session is alive.

        A session-level advisory lock ends only with an unlock (``release``
        alone sends one) or with the server session that took it, and a
        psycopg connection never moves to another session: so one round trip
        that the session answers proves the lock is held. Asking ``pg_locks``
        instead cost a scan of the server's whole lock table (and its
        activity list) before every side effect and result.
        """
        if self._conn.closed:
            return False
        try:
            self._conn.execute("SELECT 1")
        except psycopg.Error:
            self._conn.close()
            return False
        return True

    def _take_back(self) -> bool:
        """Lock again on a new connection; False while the server cannot be reached."""
        self._conn.close()
        try:
            conn = connect(self._db, connect_timeout=RETAKE_CONNECT_TIMEOUT)
        except (psycopg.Error, ApplicationError):
            return False
        try:
            row = conn.execute("SELECT pg_try_advisory_lock(%s)", (self.key,)).fetchone()
        except psycopg.Error:
            conn.close()
            return False
        if row is None or not row[0]:
            conn.close()
            self._lose("its connection was dropped and another process holds it now")
        self._conn = conn
        return True

    def _verify(self) -> bool:
        """Whether the owner still owns the turn; False when it cannot tell now."""
        if self._still_ours is None:
            return True  # nothing claimed under this lease yet: holding the lock is all
        try:
            ours = self._still_ours()
        except Exception:  # the server went away again: ask later, keeping the lock
            log.debug("cannot tell whether the turn is still ours", exc_info=True)
            return False
        if not ours:
            self._conn.close()  # drops the lock: it is someone else's turn
            self._lose("its connection was dropped and another process claimed the turn meanwhile")
        return True

    def _lose(self, why: str) -> NoReturn:
        self._lost = why
        log.warning("lease on session %s lost: %s", self.session_id, why)
        raise LeaseLost(f"lease on session {self.session_id} lost: {why}")

    def _revive(self) -> bool:
        """The watcher's turn: take the lease back if dropped. False: try again later."""
        with self._lock:
            if not self._lost and not self._unverified and not _has_input(self._conn):
                return True  # what woke the watcher was an answer to a check, now read
            try:
                return self._ensure()
            except LeaseLost:
                return True  # lost for good: nothing more to watch

    def _fileno(self) -> int:
        """The connection's socket, or -1 when there is none to watch."""
        try:
            return -1 if self._conn.closed else int(self._conn.pgconn.socket)
        except (psycopg.Error, ValueError):
            return -1

    @property
    def _done(self) -> bool:
        return bool(self._lost)


def _has_input(conn: psycopg.Connection[Any]) -> bool:
    """Whether anything arrived on an idle connection (a termination, its end of stream)."""
    if conn.closed:
        return True
    try:
        poller = select.poll()
        poller.register(conn.pgconn.socket, select.POLLIN | select.POLLERR | select.POLLHUP)
    except (psycopg.Error, OSError, ValueError):
        return True
    return bool(poller.poll(0))


LEASES_KEPT = 8  # idle lease connections a process keeps, unless told more


class Leases:
    """How a process takes leases: on connections kept between leases (``keep`` idle at most)."""

    def __init__(self, db: Database, namespace: str, keep: int = LEASES_KEPT) -> None:
        self.db = db
        self.namespace = namespace
        self.keep = keep
        self.opened = 0  # connections opened for leases (a figure for tests and benchmarks)
        self._idle: list[psycopg.Connection[Any]] = []
        self._lock = threading.Lock()
        self._closed = False

    def try_acquire(self, session_id: UUID) -> Lease | None:
        """Take the session's lease if nobody holds it; None when a live owner has it."""
        key = session_lock_key(self.namespace, session_id)
        conn = self._take_idle()
        if conn is not None:
            try:
                return self._lock_on(conn, key, session_id)
            except psycopg.Error:  # it died while idle (server restart, reaper): a new one
                conn.close()
        conn = connect(self.db)
        with self._lock:
            self.opened += 1
        return self._lock_on(conn, key, session_id)

    def _lock_on(self, conn: psycopg.Connection[Any], key: int, session_id: UUID) -> Lease | None:
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
        if row is None or not row[0]:
            self.put_back(conn)
            return None
        return Lease(conn, self.namespace, session_id, self.db, pool=self)

    def _take_idle(self) -> psycopg.Connection[Any] | None:
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed:
                    return conn
        return None

    def put_back(self, conn: psycopg.Connection[Any]) -> None:
        """Keep a connection that holds no lock for the next lease (or close it)."""
        healthy = (
            not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        )
        with self._lock:
            if healthy and not self._closed and len(self._idle) < self.keep:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        """Close the idle connections (leases still held close theirs on release)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class _Keeper:
    """One thread per process that takes dropped leases back the moment their connection dies.

    A terminated backend sends its FATAL message and closes the socket, so a
    lease's idle connection becomes readable at once: ``poll`` on every held
    lease's socket notices it without a round trip. A lease that could not be
    taken back yet (the server is down) is tried again every ``RETAKE_INTERVAL``.
    """

    def __init__(self) -> None:
        self._leases: set[Lease] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._wake_r = self._wake_w = -1

    def watch(self, lease: Lease) -> None:
        with self._lock:
            self._leases.add(lease)
            if self._thread is None or not self._thread.is_alive():
                if self._wake_r < 0:  # made on first use: importing opens nothing
                    self._wake_r, self._wake_w = os.pipe()
                    os.set_blocking(self._wake_r, False)
                    os.set_blocking(self._wake_w, False)
                self._thread = threading.Thread(
                    target=self._run, name="turnlog-lease-keeper", daemon=True
                )
                self._thread.start()
        self._wake()

    def forget(self, lease: Lease) -> None:
        with self._lock:
            self._leases.discard(lease)
        self._wake()

    def _wake(self) -> None:
        if self._wake_w < 0:
            return
        with contextlib.suppress(BlockingIOError):  # a wake-up is pending already
            os.write(self._wake_w, b"x")

    def _run(self) -> None:
        retry: list[Lease] = []
        while True:
            with self._lock:
                leases = [lease for lease in self._leases if not lease._done]
            poller = select.poll()
            poller.register(self._wake_r, select.POLLIN)
            by_fd: dict[int, Lease] = {}
            for lease in leases:
                fd = lease._fileno()
                if fd >= 0 and lease not in retry:
                    by_fd[fd] = lease
                    poller.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
            timeout = int(RETAKE_INTERVAL * 1000) if retry else None
            try:
                ready = [fd for fd, _ in poller.poll(timeout)]
            except InterruptedError:
                continue
            if self._wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    while os.read(self._wake_r, 4096):
                        pass
            due = [by_fd[fd] for fd in ready if fd in by_fd] + retry
            retry = [lease for lease in dict.fromkeys(due) if not self._revive(lease)]

    @staticmethod
    def _revive(lease: Lease) -> bool:
        try:
            return lease._revive()
        except Exception:  # never let one lease stop the watch over the others
            log.exception("taking back the lease on session %s failed", lease.session_id)
            return True


_keeper = _Keeper()


def owner_alive(conn: psycopg.Connection[Any], namespace: str, session_id: UUID) -> bool:
    """True when some live connection holds the session's lease (read-only check)."""
    return advisory_lock_holder(conn, session_lock_key(namespace, session_id)) is not None
