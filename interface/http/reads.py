"""Reads, and writes under an idempotency key, tried once more when their connection dies.

The server may terminate a pooled connection while a read is in flight (a
restart, a failover, an administrator's ``pg_terminate_backend``, an idle
connection reaper). The pool lends no connection that already shows such an
end (application/store/pool.py), but one that dies mid-query raises
``OperationalError``: a 503 to the client, although the server is up.

A read (GET, HEAD) wrote nothing, so it is run once more before the client
hears 503 — on another connection, since the pool discards the broken one,
and one pinged before it is lent (``pool.verifying``): when every backend
of the process was terminated at once, the pool's other idle connections
may be dying too without showing it yet.
A write that carries an ``Idempotency-Key`` (creating a session, submitting
a turn) is run once more too: if its first attempt committed before the
connection died, the second finds the key and answers what the first did;
if not, it writes once. A write without a key is never repeated.
A server that is really unreachable still gets its 503 at once: the second
attempt meets the pool's fail-fast check, whose ``DatabaseUnavailable`` is
not retried; nor is a pool that timed out (it is busy, and was waited for).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

import psycopg
from eventsourcing import persistence
from fastapi.routing import APIRoute
from psycopg_pool import PoolTimeout
from starlette.requests import Request
from starlette.responses import Response

from turnlog.application.errors import DatabaseUnavailable
from turnlog.application.store.pool import verifying

log = logging.getLogger("turnlog.http")

SAFE_METHODS = frozenset({"GET", "HEAD"})
_DIED = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    persistence.OperationalError,
    persistence.InterfaceError,
)


def connection_died(exc: BaseException) -> bool:
    """Whether ``exc`` is a connection lost mid-operation (not a server down, not a busy pool)."""
    if not isinstance(exc, _DIED):
        return False
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, (PoolTimeout, DatabaseUnavailable)):
            return False
        seen = seen.__cause__ or seen.__context__
    return True


class ReadRetryRoute(APIRoute):
    """A route whose reads, and writes under an Idempotency-Key, run once more after their
    connection died."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        reads = self.methods is not None and bool(self.methods) and self.methods <= SAFE_METHODS

        async def retried(request: Request) -> Response:
            if not reads and "idempotency-key" not in request.headers:
                return await handler(request)
            await request.body()  # kept on the request: the second attempt reads it again
            try:
                return await handler(request)
            except Exception as exc:
                if not connection_died(exc):
                    raise
                first = str(exc).strip().splitlines()[:1]
                log.warning(
                    "a %s lost its database connection (%s); trying once more",
                    "read" if reads else "keyed write",
                    first[0] if first else type(exc).__name__,
                )
            with verifying():
                return await handler(request)

        return retried
