"""Which errors of a sent save leave its outcome unknown (store.lost_commits.unanswered)."""

from __future__ import annotations

import psycopg
import pytest
from eventsourcing.persistence import OperationalError
from psycopg import errors

from turnlog.application.store.lost_commits import CommitOutcomeUnknown, unanswered


@pytest.mark.parametrize(
    ("error", "unknown"),
    [
        (psycopg.OperationalError("server closed the connection unexpectedly"), True),
        (errors.AdminShutdown("terminating connection"), True),  # 57P01: maybe committed
        (errors.ConnectionFailure("connection failure"), True),  # 08006
        (errors.LockNotAvailable("lock timeout"), False),  # the server refused the statement
        (errors.QueryCanceled("statement timeout"), False),
        (errors.PipelineAborted("an earlier statement failed"), False),
        (errors.UniqueViolation("version taken"), False),
        (ValueError("not a database error"), False),
    ],
)
def test_unanswered(error: Exception, unknown: bool) -> None:
    assert unanswered(error) is unknown
    # As the library raises it: its own OperationalError, the driver's as the cause.
    try:
        raise OperationalError(str(error)) from error
    except OperationalError as wrapped:
        assert unanswered(wrapped) is unknown


def test_an_unknown_commit_is_an_operational_error_carrying_the_events() -> None:
    lost = CommitOutcomeUnknown("connection lost", [])
    assert isinstance(lost, OperationalError) and lost.events == []
