"""Fencing: what a step of a turn checks before it acts, and how it saves.

A step acts only while this process owns the turn (``LeaseCheck``), and it
saves under the turn's claim number: a stale claim or a lost race means
someone else owns the turn now, and the step stops without writing
(``LeaseLost``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, TypeVar
from uuid import UUID

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


class _Held(NamedTuple):
    session: Session  # the object the steps were applied to, unsaved
    steps: list[Callable[[Session], Any]]  # to decide them again on a reloaded session


class HeldSteps:
    """Steps decided on a session object and left unsaved: its next save carries them.

    Only a step whose loss costs nothing but repeated work is held (a safe
    call's outcome, domain/durability.py): held, it is lost with the process,
    as a save that rode is lost with the database, and the call runs again.
    A save of the same object takes them; a save that loses a race decides
    them again on the session as stored, before its own step.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_session: dict[UUID, _Held] = {}

    def hold(self, session: Session, step: Callable[[Session], T]) -> T:
        """Apply ``step`` to ``session`` without saving it; returns what it returned."""
        result = step(session)
        with self._lock:
            held = self._by_session.get(session.id)
            if held is not None and held.session is session:
                held.steps.append(step)
            else:
                self._by_session[session.id] = _Held(session, [step])
        return result

    def take(self, session: Session) -> Callable[[Session], None] | None:
        """What decides the held steps of ``session`` again on a reloaded copy (None: none).

        Steps held on another object, or on one saved since (nothing pending), no
        longer apply.
        """
        with self._lock:
            held = self._by_session.pop(session.id, None)
        if held is None or held.session is not session or not session.pending_events:
            return None

        def again(reloaded: Session) -> None:
            for step in held.steps:
                step(reloaded)

        return again

    def drop(self, session_id: UUID) -> None:
        with self._lock:
            self._by_session.pop(session_id, None)


class Fenced:
    """Saves the steps of a turn fenced by its claim (a base of the agent loop's Executor)."""

    sessions: Sessions
    held: HeldSteps

    def _write(self, session: Session, claim: int, decide: Callable[[Session], Any]) -> Session:
        return self._write_result(session, claim, decide)[1]

    def _hold(self, session: Session, claim: int, decide: Callable[[Session], Any]) -> Session:
        """Apply a step whose loss costs only repeated work; the next save carries it."""
        try:
            self.held.hold(session, decide)
        except domain_errors.StaleClaim as exc:
            raise LeaseLost(f"turn ownership lost (claim {claim}): {exc}") from None
        except domain_errors.InvalidTransition as exc:
            raise LeaseLost(f"turn changed under us (claim {claim}): {exc.detail}") from None
        return session

    def _save(self, session: Session, decide: Callable[[Session], T]) -> tuple[T, Session]:
        """``Sessions.update`` from ``session``, with the steps held on it (``HeldSteps``)."""
        again = self.held.take(session)

        def decided(s: Session) -> tuple[T, Session]:
            if again is not None and s is not session:  # reloaded after a lost race
                again(s)
            return decide(s), s

        return self.sessions.update(session.id, decided, current=session)[0]

    def _write_result(
        self, session: Session, claim: int, decide: Callable[[Session], T]
    ) -> tuple[T, Session]:
        """Save a fenced step: what ``decide`` returned, and the session, now current.

        A stale claim or a lost race means we no longer own the turn.
        """
        try:
            return self._save(session, decide)
        except (domain_errors.StaleClaim, ConcurrentModification) as exc:
            raise LeaseLost(f"turn ownership lost (claim {claim}): {exc}") from None
        except domain_errors.InvalidTransition as exc:
            raise LeaseLost(f"turn changed under us (claim {claim}): {exc.detail}") from None
