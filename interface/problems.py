"""The one table from exceptions to HTTP statuses and CLI exit codes.

Routes and commands never decide a status for a business rule; they raise,
and this table answers. Anything not in it is a bug (500 / exit 1).

Besides the domain's and the application's errors, the table knows the
refusals the interface itself decides before any use case runs::

    RequestRefused
    ├── InvalidRequest       (422) the request does not match its schema
    ├── Unauthorized         (401) missing or wrong bearer token
    ├── RoleForbidden        (403) the token's role does not allow this route
    ├── NamespaceNotFound    (404) an admin asked for a namespace this server does not serve
    ├── PayloadTooLarge      (413) body over the limit; refused before parsing
    ├── ReadModelLagging     (503) a read model did not reach ?min_position in time
    ├── TooManyStreams       (503) every live event stream slot is taken
    ├── TooManyWaits         (503) every ``?wait=`` slot is taken
    └── NotReady             (503) the process is starting or stopping

Driver errors that mean "the database cannot be reached" (psycopg's and the
eventsourcing library's OperationalError, a pool timeout) are 503 too, with
``Retry-After``: the client may simply try again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg
from eventsourcing import persistence as es_persistence

from turnlog.application import errors as app_errors
from turnlog.domain import errors as domain_errors


class RequestRefused(Exception):
    """Base of refusals decided by the interface, before any use case runs."""

    code = "request_refused"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra: dict[str, Any] = extra


class InvalidRequest(RequestRefused):
    """The request's body, query or headers do not match the endpoint's schema."""

    code = "validation_error"


class Unauthorized(RequestRefused):
    """A /v1 route was called without the configured bearer token."""

    code = "unauthorized"


class RoleForbidden(RequestRefused):
    """The token is valid, but its role (the tenants file) does not allow this route."""

    code = "role_forbidden"


class NamespaceNotFound(RequestRefused):
    """An X-Turnlog-Namespace header names no namespace this token can reach."""

    code = "namespace_not_found"


class PayloadTooLarge(RequestRefused):
    """The request body is larger than the server accepts."""

    code = "payload_too_large"


class ReadModelLagging(RequestRefused):
    """A read model had not reached the requested log position within the wait."""

    code = "read_model_lagging"


class TooManyStreams(RequestRefused):
    """Every slot for live event streams is taken."""

    code = "too_many_streams"


class TooManyWaits(RequestRefused):
    """Every slot for waiting on a turn (``?wait=``) is taken."""

    code = "too_many_waits"


class NotReady(RequestRefused):
    """The process is still starting (or already stopping) and cannot serve this yet."""

    code = "not_ready"


@dataclass(frozen=True)
class Problem:
    """How an error is shown: status, title, a stable code, and what else a client needs."""

    status: int
    title: str
    code: str
    detail: str
    extra: dict[str, Any] = field(default_factory=dict)
    retry_after: int | None = None  # seconds; sent as Retry-After


@dataclass(frozen=True)
class _Entry:
    cls: type[BaseException]
    status: int
    title: str
    retry_after: int | None = None
    code: str | None = None  # for exceptions without their own stable code
    detail: str | None = None  # for exceptions whose message must not be shown


_DB_DOWN = "the database cannot be reached right now; try again shortly"

_TABLE: list[_Entry] = [
    _Entry(domain_errors.InvalidInput, 422, "Invalid input"),
    _Entry(domain_errors.NotFound, 404, "Not found"),
    _Entry(domain_errors.Conflict, 409, "Conflict"),
    _Entry(app_errors.SessionNotFound, 404, "Not found"),
    _Entry(app_errors.SessionPurged, 410, "Gone"),
    _Entry(app_errors.PurgeRefused, 409, "Conflict"),
    _Entry(app_errors.ConcurrentModification, 409, "Conflict"),
    _Entry(app_errors.LeaseLost, 409, "Conflict"),
    _Entry(app_errors.ProjectionBusy, 409, "Conflict"),
    _Entry(app_errors.ProjectionConflict, 409, "Conflict"),
    _Entry(app_errors.InvalidQuery, 422, "Invalid query"),
    _Entry(app_errors.ConfigurationError, 422, "Invalid configuration"),
    _Entry(app_errors.InvalidNamespace, 422, "Invalid namespace"),
    _Entry(app_errors.InvalidToolArguments, 422, "Invalid tool arguments"),
    _Entry(app_errors.QuotaExceeded, 429, "Quota exceeded", retry_after=1),
    _Entry(app_errors.DatabaseUnavailable, 503, "Database unavailable", retry_after=5),
    _Entry(app_errors.SchemaNotReady, 503, "Schema not ready", retry_after=5),
    _Entry(InvalidRequest, 422, "Invalid request"),
    _Entry(Unauthorized, 401, "Unauthorized"),
    _Entry(RoleForbidden, 403, "Forbidden"),
    _Entry(NamespaceNotFound, 404, "Not found"),
    _Entry(PayloadTooLarge, 413, "Payload too large"),
    _Entry(ReadModelLagging, 503, "Read model lagging", retry_after=1),
    _Entry(TooManyStreams, 503, "Too many event streams", retry_after=5),
    _Entry(TooManyWaits, 503, "Too many waits", retry_after=2),
    _Entry(NotReady, 503, "Not ready", retry_after=2),
    # Driver-level "cannot reach the server": their messages name hosts, not
    # passwords, but they are noise to a client; say what it means instead.
    _Entry(
        psycopg.OperationalError, 503, "Database unavailable", 5, "database_unavailable", _DB_DOWN
    ),
    _Entry(
        es_persistence.OperationalError,
        503,
        "Database unavailable",
        5,
        "database_unavailable",
        _DB_DOWN,
    ),
    _Entry(
        es_persistence.InterfaceError,
        503,
        "Database unavailable",
        5,
        "database_unavailable",
        _DB_DOWN,
    ),
]

EXIT_CODES = {401: 2, 403: 2, 404: 4, 409: 3, 410: 4, 422: 2, 413: 2, 503: 5}


def problem_for(exc: BaseException) -> Problem | None:
    """The problem for a known error, or None for a bug."""
    for entry in _TABLE:
        if isinstance(exc, entry.cls):
            code = str(entry.code or getattr(exc, "code", "error"))
            detail = str(entry.detail or getattr(exc, "detail", str(exc)))
            extra = dict(getattr(exc, "extra", None) or {})
            retry_after = getattr(exc, "retry_after", None) or entry.retry_after
            return Problem(entry.status, entry.title, code, detail, extra, retry_after)
    return None


def exit_code_for(status: int) -> int:
    return EXIT_CODES.get(status, 1)
