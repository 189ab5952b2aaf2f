"""The ids a log line is about: session, turn, tool call, worker, HTTP request.

Code that starts a unit of work binds its ids for the duration
(``with bound(session_id=..., turn_id=...)``); every line logged meanwhile
in that context — ours, the database driver's, the HTTP server's — carries
them, because the interface's log filter copies ``current()`` onto each
record. Only the standard library is used here, so the application can bind
ids without knowing how (or whether) lines are formatted.

Context variables follow asyncio tasks and are copied into the threads the
HTTP layer hands blocking work to; a thread started with ``threading.Thread``
or a ``ThreadPoolExecutor`` starts empty, so such work binds its own ids.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType

FIELDS = ("request_id", "session_id", "turn_id", "call_id", "worker_id")

_EMPTY: Mapping[str, str] = MappingProxyType({})
_bound: ContextVar[Mapping[str, str]] = ContextVar("turnlog_log_context", default=_EMPTY)


@contextmanager
def bound(**ids: object) -> Iterator[None]:
    """Add ``ids`` (empty values are skipped) to every line logged inside the block."""
    added = {key: str(value) for key, value in ids.items() if value not in (None, "")}
    token = _bound.set(MappingProxyType({**_bound.get(), **added}))
    try:
        yield
    finally:
        _bound.reset(token)


@contextmanager
def only(**ids: object) -> Iterator[None]:
    """Bind exactly ``ids`` inside the block, dropping whatever the context carried in.

    For the start of a unit of work whose context may hold another's ids: an
    HTTP server's transport callbacks run in a context copied from whichever
    request last resumed reading on the connection, and a later request on that
    connection starts from a copy of it.
    """
    fresh = {key: str(value) for key, value in ids.items() if value not in (None, "")}
    token = _bound.set(MappingProxyType(fresh))
    try:
        yield
    finally:
        _bound.reset(token)


def current() -> Mapping[str, str]:
    """The ids bound in this context (read-only)."""
    return _bound.get()
