"""Application errors: a use case could not be carried out.

Each has a stable ``code``; the interface maps them (and the domain's) to
statuses and exit codes in one place. The tree::

    ApplicationError
    ├── SessionNotFound          (404)
    ├── SessionPurged            (410) the session existed and was purged
    ├── PurgeRefused             (409) a worker drives the session, or its read models lag
    ├── ConcurrentModification   (409) a conflict persisted after one reload and retry
    ├── LeaseLost                (409) this process no longer owns the turn
    ├── ProjectionBusy           (409) another runner holds the read model's lock
    ├── ProjectionConflict       (409) another writer moved the read model's position
    ├── InvalidQuery             (422) a read-model query's filter, limit or cursor is malformed
    │   ├── InvalidCursor
    │   ├── InvalidPosition     a log position that names no event of this namespace's log
    │   └── UnknownProjection
    ├── InvalidNamespace         (422)
    ├── InvalidToolArguments     (422) an operator's edited arguments fail the tool's schema
    ├── QuotaExceeded            (429) a namespace's quota (the tenants file) would be passed
    ├── DatabaseUnavailable      (503)
    ├── SchemaNotReady           (503) the events table must be created or migrated first
    └── ConfigurationError       refused at start-up (a bad tools file)
"""

from __future__ import annotations

from typing import Any


class ApplicationError(Exception):
    """Base of the application's own errors."""

    code = "application_error"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra: dict[str, Any] = extra


class SessionNotFound(ApplicationError):
    """No session with that id exists in this namespace."""

    code = "session_not_found"


class SessionPurged(ApplicationError):
    """The session existed and was purged: its events are gone, its purge record stays."""

    code = "session_purged"


class PurgeRefused(ApplicationError):
    """A purge cannot go on now (a worker holds the session, or the read models lag);
    what it did so far is recorded, and asking again finishes it."""

    code = "purge_refused"


class ConcurrentModification(ApplicationError):
    """Another writer changed the session, and the command still conflicted after a retry."""

    code = "concurrent_modification"


class LeaseLost(ApplicationError):
    """This process lost ownership of a turn (its lease or claim is gone)."""

    code = "lease_lost"


class InvalidNamespace(ApplicationError):
    """The namespace is not a valid identifier; nothing was sent to the database."""

    code = "invalid_namespace"


class DatabaseUnavailable(ApplicationError):
    """PostgreSQL could not be reached."""

    code = "database_unavailable"


class SchemaNotReady(ApplicationError):
    """The namespace's events table needs migrating, and this process may not or could not.

    Only the processes that own the schema migrate it (``serve``, ``worker``,
    ``projections run``, ``db init``), and only without waiting long for a
    lock: nothing was changed.
    """

    code = "schema_not_ready"


class ProjectionBusy(ApplicationError):
    """A rebuild could not take a read model's lock: a live runner holds it."""

    code = "projection_busy"


class ProjectionConflict(ApplicationError):
    """A read model's position moved under a batch (another writer); the batch rolled back."""

    code = "projection_conflict"


class InvalidQuery(ApplicationError):
    """A read-model query has a malformed filter, limit or cursor; nothing was read."""

    code = "invalid_query"


class InvalidCursor(InvalidQuery):
    """A pagination cursor is not one this list handed out."""

    code = "invalid_cursor"


class InvalidPosition(InvalidQuery):
    """A log position that names no event of this namespace's log (past its end, or unknown)."""

    code = "invalid_position"


class InvalidVersion(InvalidQuery):
    """A session version this session never had (below 1 or past its latest)."""

    code = "invalid_version"


class UnknownProjection(InvalidQuery):
    """No read model has that name."""

    code = "unknown_projection"


class QuotaExceeded(ApplicationError):
    """A new session or turn would pass its namespace's quota; nothing was written."""

    code = "quota_exceeded"

    @property
    def retry_after(self) -> int | None:
        value = self.extra.get("retry_after")
        return int(value) if value is not None else None


class ConfigurationError(ApplicationError):
    """A setting cannot be used: a tools or tenants file is unreadable or invalid,
    or no database is configured and the embedded server is not installed."""

    code = "invalid_configuration"


class InvalidToolArguments(ApplicationError):
    """Arguments an operator edited when approving a call do not match the tool's schema."""

    code = "invalid_tool_arguments"
