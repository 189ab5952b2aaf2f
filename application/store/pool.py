"""Connection pools that say at once when PostgreSQL cannot be reached, where asked to.

The library's pool waits up to its timeout (``POSTGRES_CONNECT_TIMEOUT``,
10 s) for a connection, and the library retries most operations ten times on
an ``OperationalError`` — which a pool timeout is. While the server is down a
request therefore waited 50 to 100 s before its 503. That patience is right
for a worker recording a tool's result (the server is often back within
seconds, and a result recorded beats a turn interrupted), and wrong for an
HTTP client, who should hear "unavailable, retry later" at once.

So the patience is chosen per caller: code running inside ``failing_fast()``
(the HTTP API's requests) waits at most ``PROBE_AFTER`` for a connection; if
none came, a fresh connection attempt (shared by every waiter for
``PROBE_TTL``) tells whether the server is reachable. Unreachable raises
``DatabaseUnavailable``, which the library does not retry (503 with
Retry-After); reachable means the pool is merely busy, and the wait goes on
for the rest of the timeout. Everything else keeps the library's behaviour.

Connections are not pinged on checkout (that was one round trip per
checkout, several per turn). Instead a lent connection is checked without
a round trip: an idle pooled connection on which the server has sent
anything (the error a terminated backend sends, the end of the stream of a
restarted server) is dead or suspect; it is closed, the pool opens a
replacement, and the next one is tried at once. A connection that dies
while in use raises ``OperationalError``, which the library's recorders
retry (and which is a 503 with Retry-After to an HTTP client).

That check cannot see a connection whose server process was told to end
a moment ago and has not yet said so. When every backend of a process is
terminated at once, a request whose connection died and that is tried
again (interface/http/reads.py) could be lent such a sibling and fail a
second time; so the code inside ``verifying()`` (that second attempt)
also pings each connection it is lent (one round trip,
``ConnectionPool.check_connection``) and takes another when the ping fails.
"""

from __future__ import annotations

import select
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import psycopg
from eventsourcing.postgres import ConnectionPool, PostgresFactory
from eventsourcing.utils import EnvType
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import PoolTimeout

from turnlog.application.errors import DatabaseUnavailable
from turnlog.application.store.seal import SnapshotRecorder

PROBE_AFTER = 1.0  # seconds a fail-fast caller waits for a pooled connection before probing
PROBE_TTL = 0.25  # seconds a probe's verdict is shared (how long a recovery may go unseen)
PROBE_CONNECT_TIMEOUT = 2  # seconds (libpq's connect_timeout: whole seconds)

RECONNECT_TIMEOUT = 2.0  # seconds the pool retries one connection in the background

_fail_fast: ContextVar[bool] = ContextVar("turnlog_fail_fast", default=False)
_verifying: ContextVar[bool] = ContextVar("turnlog_verifying", default=False)


@contextmanager
def failing_fast() -> Iterator[None]:
    """Within this block (and threads started from its context), pools fail fast."""
    token = _fail_fast.set(True)
    try:
        yield
    finally:
        _fail_fast.reset(token)


def fails_fast() -> bool:
    """Whether the current context fails fast (see ``failing_fast``)."""
    return _fail_fast.get()


@contextmanager
def verifying() -> Iterator[None]:
    """Within this block, every connection lent is pinged first (see the module doc)."""
    token = _verifying.set(True)
    try:
        yield
    finally:
        _verifying.reset(token)


def answers(conn: Any) -> bool:
    """Whether a connection answers a ping (one round trip)."""
    try:
        ConnectionPool.check_connection(conn)
    except psycopg.Error:
        return False
    return True


def fail_fast() -> None:
    """Make the rest of the current context fail fast (an HTTP request's task)."""
    _fail_fast.set(True)


class Reachability:
    """Whether a new connection to the server can be made now; one probe at a time."""

    def __init__(self, kwargs: dict[str, Any]) -> None:
        self._kwargs = {k: v for k, v in kwargs.items() if k != "row_factory"}
        self._lock = threading.Lock()
        self._checked_at = float("-inf")
        self._reachable = True
        self.detail = ""

    def known_down(self) -> bool:
        """True when a probe of the last ``PROBE_TTL`` seconds failed."""
        return not self._reachable and time.monotonic() - self._checked_at < PROBE_TTL

    def check(self) -> None:
        """Raise DatabaseUnavailable unless the server accepts a connection."""
        with self._lock:
            if time.monotonic() - self._checked_at >= PROBE_TTL:
                self._probe()
        if not self._reachable:
            raise DatabaseUnavailable(f"PostgreSQL cannot be reached: {self.detail}")

    def _probe(self) -> None:
        try:
            with psycopg.connect(**self._kwargs, connect_timeout=PROBE_CONNECT_TIMEOUT):
                self._reachable, self.detail = True, ""
        except psycopg.OperationalError as exc:
            self._reachable, self.detail = False, str(exc).strip().splitlines()[0]
        self._checked_at = time.monotonic()


def looks_alive(conn: Any) -> bool:
    """Whether an idle pooled connection may be lent, judged without a round trip."""
    if conn.closed or getattr(conn, "broken", False):
        return False
    pgconn = conn.pgconn
    try:
        poller = select.poll()
        poller.register(pgconn.socket, select.POLLIN | select.POLLERR | select.POLLHUP)
    except (psycopg.Error, OSError, ValueError):
        return False
    # Nothing is due on an idle connection: whatever arrived is a server-side
    # termination (FATAL, then the end of the stream) or something unasked for.
    return not poller.poll(0)


class FailFastPool(ConnectionPool[Any]):
    """The library's pool; inside ``failing_fast()`` it gives up at once on a dead server."""

    reachability: Reachability

    def getconn(self, timeout: float | None = None) -> Any:
        # A dead connection is discarded (the pool replaces it) and another is
        # taken at once, without the pool's backoff between failed checks.
        for _ in range(self.max_size + 1):
            conn = self._getconn(timeout)
            if looks_alive(conn) and (not _verifying.get() or answers(conn)):
                return conn
            conn.close()
            self.putconn(conn)
        return self._getconn(timeout)

    def _getconn(self, timeout: float | None) -> Any:
        if not _fail_fast.get():
            return super().getconn(timeout)
        timeout = self.timeout if timeout is None else timeout
        if self.reachability.known_down():
            self.reachability.check()  # raises, with the probe's reason
        try:
            return super().getconn(min(PROBE_AFTER, timeout))
        except PoolTimeout:
            if timeout <= PROBE_AFTER:
                raise
        self.reachability.check()
        # Reachable: the pool is only busy. Wait the rest (once, to keep the
        # queue fair); a server lost meanwhile ends in the library's timeout.
        return super().getconn(timeout - PROBE_AFTER)


class TurnlogFactory(PostgresFactory):
    """The library's PostgreSQL factory, its pool able to fail fast (see the module doc).

    Its aggregate recorder (the Sessions application's snapshots) seals the
    snapshots it stores and checks the seal of those it loads
    (``application.store.seal``).
    """

    aggregate_recorder_class = SnapshotRecorder

    def __init__(self, env: EnvType | None) -> None:
        super().__init__(env)
        pool: Any = self.datastore.pool
        # The library builds its pool itself and offers no hook for the class;
        # the pool is not opened yet and FailFastPool adds no instance state
        # besides ``reachability``, so changing the class here is sound.
        pool.__class__ = FailFastPool
        # The pool retries a failed connection with exponential backoff (1, 2,
        # 4, 8, 16 s …) for up to 300 s: after an outage of 20 s the pool saw
        # the server again only ~10 s after it was back. Giving up sooner hands
        # reconnection back to demand: the next waiting caller tries at once.
        pool.reconnect_timeout = RECONNECT_TIMEOUT
        kwargs = pool.kwargs() if callable(pool.kwargs) else pool.kwargs
        # The URL's parameters beyond host, port, database, user and password
        # (application/store/database.py: library_env), e.g. a multi-host URL's
        # target_session_attrs: every new connection finds the primary.
        extra = conninfo_to_dict(self.env.get("TURNLOG_CONNINFO_EXTRA") or "")
        if extra and isinstance(kwargs, dict):
            kwargs.update(extra)
        pool.reachability = Reachability(dict(kwargs or {}))
        # Read by the recorder's create_table (application/store/recorder.py).
        owns = (self.env.get("TURNLOG_OWNS_SCHEMA") or "y").lower() not in ("n", "no", "0")
        self.datastore.turnlog_owns_schema = owns  # type: ignore[attr-defined]

    def close(self) -> None:
        # Notifications still pending go out before the pool closes.
        for notifier in getattr(self.datastore, "turnlog_notifiers", []):
            notifier.close()
        super().close()
