"""The one table from exceptions to HTTP statuses and CLI exit codes.

Routes and commands never decide a status for a business rule; they raise,
and this table answers. Anything not in it is a bug (500 / exit 1).
"""

from __future__ import annotations

from dataclasses import dataclass

from application import errors as app_errors
from domain import errors as domain_errors


@dataclass(frozen=True)
class Problem:
    """How an error is shown: status, title and a stable code."""

    status: int
    title: str
    code: str
    detail: str


_STATUS: list[tuple[type[Exception], int, str]] = [
    (domain_errors.InvalidInput, 422, "Invalid input"),
    (domain_errors.NotFound, 404, "Not found"),
    (domain_errors.Conflict, 409, "Conflict"),
    (app_errors.SessionNotFound, 404, "Not found"),
    (app_errors.ConcurrentModification, 409, "Conflict"),
    (app_errors.LeaseLost, 409, "Conflict"),
    (app_errors.InvalidNamespace, 422, "Invalid namespace"),
    (app_errors.DatabaseUnavailable, 503, "Database unavailable"),
]

EXIT_CODES = {404: 4, 409: 3, 422: 2, 413: 2, 503: 5}


def problem_for(exc: Exception) -> Problem | None:
    """The problem for a known error, or None for a bug."""
    for cls, status, title in _STATUS:
        if isinstance(exc, cls):
            code = getattr(exc, "code", "error")
            detail = getattr(exc, "detail", str(exc))
            return Problem(status, title, code, detail)
    return None


def exit_code_for(status: int) -> int:
    return EXIT_CODES.get(status, 1)
