"""What the client raises::

TurnlogError
├── ApiError            the server answered with a problem (RFC 9457); ``code`` is stable
├── NotATurnlogServer   the URL answered, but not as a turnlog server does
├── ServerUnreachable   no answer (connection refused, reset, timed out) after the retries
└── TurnWaitTimeout     ``wait_for_turn``: the turn was still moving when the time ran out
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from turnlog.interface.client.models import Turn


class TurnlogError(Exception):
    """Base of every error the client raises."""


class ApiError(TurnlogError):
    """The server refused the request with an ``application/problem+json`` answer.

    ``code`` is the problem's stable code (``turn_in_progress``,
    ``unresolved_turn``, ``session_not_found``, ``validation_error`` …);
    ``problem`` holds every member, including the code's extras (for
    ``unresolved_turn``, the unknown calls).
    """

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.problem = problem
        self.code = str(problem.get("code", f"http_{status}"))
        self.title = str(problem.get("title", ""))
        self.detail = str(problem.get("detail", ""))
        self.request_id: str | None = problem.get("request_id")
        super().__init__(f"{status} {self.code}: {self.detail or self.title}")

    @property
    def retry_after(self) -> float | None:
        value = self.problem.get("retry_after")
        return float(value) if isinstance(value, int | float) else None


class NotATurnlogServer(TurnlogError):
    """The URL answered, but not with a turnlog API's JSON or problem documents."""


class ServerUnreachable(TurnlogError):
    """The server gave no answer, even after the retries that were safe."""


class TurnWaitTimeout(TurnlogError):
    """``wait_for_turn`` gave up: the turn had not finished; ``turn`` is how it was last seen."""

    def __init__(self, turn: Turn, timeout: float) -> None:
        self.turn = turn
        self.timeout = timeout
        super().__init__(
            f"turn {turn.turn_id} still {turn.state} after {timeout:g}s;"
            " it goes on: wait again, or cancel it"
        )
