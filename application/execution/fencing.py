"""Fencing: what a step of a turn checks before it acts, and how it saves.

A step acts only while this process owns the turn (``LeaseCheck``), and it
saves under the turn's claim number: a stale claim or a lost race means
someone else owns the turn now, and the step stops without writing
(``LeaseLost``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from turnlog.application.errors import ConcurrentModification, LeaseLost
from turnlog.application.sessions import Sessions
from turnlog.domain import errors as domain_errors
from turnlog.domain.session import Session

T = TypeVar("T")


class LeaseCheck(Protocol):
    """Something that raises LeaseLost when this process no longer owns the turn."""

    def check(self) -> None: ...

    def guard(self, still_ours: Callable[[], bool] | None) -> None:
        """Whom to ask, after a lost lock was taken back, whether the turn is still ours."""
        ...


class Unleased:
    """For callers that fence by claim alone (tests, single-process tools)."""

    def check(self) -> None:
        return None

    def guard(self, still_ours: Callable[[], bool] | None) -> None:
        return None


class Fenced:
    """Saves the steps of a turn fenced by its claim (a base of the agent loop's Executor)."""

    sessions: Sessions

    def _write(self, session: Session, claim: int, decide: Callable[[Session], Any]) -> Session:
        return self._write_result(session, claim, decide)[1]

    def _write_result(
        self, session: Session, claim: int, decide: Callable[[Session], T]
    ) -> tuple[T, Session]:
        """Save a fenced step: what ``decide`` returned, and the session, now current.

        A stale claim or a lost race means we no longer own the turn.
        """
        try:
            return self.sessions.update(session.id, lambda s: (decide(s), s), current=session)[0]
        except (domain_errors.StaleClaim, ConcurrentModification) as exc:
            raise LeaseLost(f"turn ownership lost (claim {claim}): {exc}") from None
        except domain_errors.InvalidTransition as exc:
            raise LeaseLost(f"turn changed under us (claim {claim}): {exc.detail}") from None
