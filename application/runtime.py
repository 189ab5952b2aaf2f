"""Use cases that span the application's parts: send a message, recover, continue.

``Runtime`` holds the process's one ``Sessions`` application, its executor
and the database handle; the interface builds it once (interface/bootstrap).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any
from uuid import UUID

from turnlog.application.errors import InvalidToolArguments, LeaseLost
from turnlog.application.execution.cancel_watch import utc_now
from turnlog.application.execution.leases import LEASES_KEPT, Lease, Leases
from turnlog.application.execution.loop import Executor
from turnlog.application.execution.settling import settle_by_probe
from turnlog.application.observer import cancel_kind
from turnlog.application.sessions import CONTENDED_ATTEMPTS, Sessions, Submitted, Written
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database
from turnlog.application.tools.port import ToolError, check_arguments
from turnlog.application.tools.probes import prober_of
from turnlog.domain.progress import Decision, Verdict, decide
from turnlog.domain.session import Session
from turnlog.domain.turns import Turn, TurnState

log = logging.getLogger("turnlog.runtime")


@dataclass
class Sent:
    """The outcome of sending a message: the submission, the finished turn, recovery done first."""

    submitted: Submitted
    turn: Turn
    recovered: Verdict | None


@dataclass
class Runtime:
    """The application as one process uses it."""

    settings: Settings
    db: Database
    sessions: Sessions
    executor: Executor
    # Lease connections kept open between leases: as many as the leases the
    # process holds at once (a worker's concurrency), or each turn past them
    # opens a new connection, costly on both sides.
    leases_kept: int = LEASES_KEPT
    leases: Leases = field(init=False)

    def __post_init__(self) -> None:
        self.leases = Leases(self.db, self.settings.namespace, keep=self.leases_kept)

    def send(
        self,
        session_id: UUID,
        message: str,
        idempotency_key: str = "",
        *,
        enqueue: bool = False,
        deadline_seconds: float | None = None,
    ) -> Sent:
        """Submit a message and run its turn here, after recovering an orphaned turn.

        ``enqueue`` and ``deadline_seconds`` are those of ``Sessions.submit_turn``.

        Holding the session's lease first means: if another live process owns
        the session, the submission is refused as a turn in progress; if the
        previous owner died, its turn is recovered before anything new starts.
        """
        lease = self.leases.try_acquire(session_id)
        if lease is None:
            submitted = self.sessions.submit_turn(
                session_id,
                message,
                idempotency_key,
                enqueue=enqueue,
                deadline_seconds=deadline_seconds,
            )
            return Sent(
                submitted, self.sessions.turn_record(session_id, submitted.turn_id)[1], None
            )
        with lease:
            recovered = self.drive(session_id, lease)  # a session not found is refused here
            # The submission and its claim in one save, when the turn may start now.
            submitted, ran = self.executor.submit_and_run(
                session_id,
                message,
                idempotency_key,
                lease=lease,
                enqueue=enqueue,
                deadline_seconds=deadline_seconds,
            )
            self.drive(session_id, lease)  # what it left open, or queued behind it
            if ran is None or ran.state.is_open:
                ran = self.sessions.turn_record(session_id, submitted.turn_id)[1]
            return Sent(submitted, ran, recovered[0] if recovered else None)

    def drive(
        self,
        session_id: UUID,
        lease: Lease | None = None,
        stop: threading.Event | None = None,
        told: Callable[[Verdict], None] | None = None,
    ) -> list[Verdict] | None:
        """The one driver of a session's turns (the worker, ``send``, ``check --apply`` …).

        Takes the session's lease unless one is given, then recovers or runs
        the open turn, and each turn queued behind it, until none is open or
        one is left for an operator. Returns what recovery decided, turn by
        turn (each also to ``told``); None when a live owner holds the lease.
        """
        if lease is None:
            lease = self.leases.try_acquire(session_id)
            if lease is None:
                return None
            with lease:
                return self._drive(session_id, lease, stop, told)
        return self._drive(session_id, lease, stop, told)

    def _drive(
        self,
        session_id: UUID,
        lease: Lease,
        stop: threading.Event | None,
        told: Callable[[Verdict], None] | None,
    ) -> list[Verdict]:
        verdicts: list[Verdict] = []
        while stop is None or not stop.is_set():
            verdict = self.recover(session_id, lease, stop)
            if verdict is None:
                break
            verdicts.append(verdict)
            if told is not None:
                told(verdict)
            if verdict.decision is Decision.INTERRUPT or verdict.decision.startswith("leave"):
                break  # left for an operator
            # The turn ended; go on only if another one is open (queued behind it).
            if self.sessions.get_session(session_id).open_turn is None:
                break
        return verdicts

    def recover(
        self, session_id: UUID, lease: Lease, stop: threading.Event | None = None
    ) -> Verdict | None:
        """Act once on the session's open turn, whose owner is gone since we hold the lease.

        Called by ``drive``, which loops over the turns a session has open.
        """
        session = self.sessions.get_session(session_id)
        turn = session.open_turn
        if turn is None:
            return None
        now = utc_now()
        verdict = decide(
            session, turn, False, self.executor.max_steps, probes=self.probed_tools(), now=now
        )
        # Starting a queued turn is no recovery: said at DEBUG (the claim is logged).
        level = logging.DEBUG if verdict.decision is Decision.START else logging.INFO
        if log.isEnabledFor(level):
            log.log(level, "recovery: %s", verdict.decision, extra=verdict.as_dict())
        if verdict.decision is Decision.PROBE:
            settled = settle_by_probe(
                self.executor, session_id, turn.turn_id, verdict.call_id, lease
            )
            verdict = replace(
                verdict,
                detail=f"{verdict.detail}: {settled.action}"
                f" ({settled.answer or 'no probe'}: {settled.detail})",
            )
            if not settled.interrupted:
                self.executor.run_turn(session_id, turn.turn_id, lease, stop)
        elif verdict.decision is Decision.INTERRUPT:
            previous = turn.worker_id
            by = self.executor.worker_id
            self.sessions.update(session_id, lambda s: s.interrupt_turn(turn.turn_id, previous, by))
            self.executor.observer.turn_ended("interrupted")
        elif verdict.decision is Decision.CANCEL and turn.state is not TurnState.RUNNING:
            # Queued or awaiting approval: no one runs it, so no claim is needed.
            reason = turn.cancel_due(now)
            self.sessions.update(session_id, lambda s: s.finish_cancel(turn.turn_id, now))
            self.executor.observer.turn_ended("cancelled")
            self.executor.observer.turn_cancelled(cancel_kind(reason))
        elif not verdict.decision.startswith("leave"):
            self.executor.run_turn(session_id, turn.turn_id, lease, stop, session=session)
        return verdict

    def probed_tools(self) -> frozenset[str]:
        """The tools whose probe recovery asks (none unless probes are on)."""
        if not self.settings.probes:
            return frozenset()
        # The tools known now: a deferred source (an MCP server) has no probes.
        loaded = self.executor.tools.loaded()
        return frozenset(t.spec.name for t in loaded if prober_of(t) is not None)

    def continue_session(self, session_id: UUID) -> list[Verdict]:
        """Take the lease and recover or resume whatever turn is open (after a resolve)."""
        verdicts = self.drive(session_id)
        if verdicts is None:
            raise LeaseLost(f"session {session_id} is owned by a live process")
        return verdicts

    def abandon_turn(self, session_id: UUID, turn_id: str, reason: str, actor: str) -> Written:
        return self.sessions.abandon_turn(session_id, turn_id, reason, actor)

    def resolve_tool_call(
        self, session_id: UUID, call_id: str, outcome: str, result: Any, note: str, actor: str
    ) -> tuple[Turn, Written]:
        return self.sessions.resolve_tool_call(session_id, call_id, outcome, result, note, actor)

    def cancel_turn(
        self, session_id: UUID, turn_id: str, reason: str, actor: str, force: bool = False
    ) -> tuple[str, Written]:
        """Cancel a turn: at once when no one runs it, else by a request its owner acts on."""
        done = self.sessions.update(
            session_id,
            lambda s: s.cancel_turn(turn_id, reason, actor, force),
            attempts=CONTENDED_ATTEMPTS,
        )
        if done[0] == "cancelled" and done[1].position is not None:
            self.executor.observer.turn_cancelled(cancel_kind(reason))
        return done

    def approve_tool_call(
        self,
        session_id: UUID,
        call_id: str,
        actor: str,
        note: str = "",
        arguments: dict[str, Any] | None = None,
    ) -> tuple[Turn, Written]:
        """Let a proposed call start; edited ``arguments`` must match the tool's schema."""

        def approve(s: Session) -> Turn:
            call = s.proposed_call(call_id)
            if arguments is not None:
                self._check_arguments(call.name, arguments)
            return s.approve_tool_call(call_id, actor, note, arguments)

        done = self.sessions.update(session_id, approve, attempts=CONTENDED_ATTEMPTS)
        self.executor.observer.call_decided("approved")
        return done

    def reject_tool_call(
        self, session_id: UUID, call_id: str, actor: str, reason: str
    ) -> tuple[Turn, Written]:
        """Refuse a proposed call; the model is told, and the turn goes on."""
        done = self.sessions.update(
            session_id,
            lambda s: s.reject_tool_call(call_id, actor, reason),
            attempts=CONTENDED_ATTEMPTS,
        )
        self.executor.observer.call_decided("rejected")
        return done

    def _check_arguments(self, name: str, arguments: dict[str, Any]) -> None:
        tool = self.executor.tools.get(name)
        if tool is None:
            raise InvalidToolArguments(f"tool {name!r} is not available in this process")
        if not isinstance(arguments, dict):
            raise InvalidToolArguments("arguments must be an object")
        try:
            check_arguments(tool.spec, arguments)
        except ToolError as exc:
            raise InvalidToolArguments(str(exc)) from None

    def close(self) -> None:
        self.executor.tools.close()  # its MCP sessions, and their servers
        self.executor.providers.close()
        self.leases.close()
        self.sessions.close()
