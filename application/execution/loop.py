"""The agent loop: run one turn, step by step, each step recorded before it is acted on.

claim → request → ModelReplied (+ the first call's ToolCallStarted, one save)
→ run the tool → ToolCallSucceeded/Failed → next request … → TurnCompleted.
A side-effecting call's outcome is committed alone; a safe call's is held for
the turn's next save (docs/durability.md). Slow work (the model, a tool)
never runs inside a database transaction: every save is its own short one.

The loop asks ``domain.progress.next_step`` what to do, so a turn resumed
after a crash takes exactly the step an uninterrupted run would have taken.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

from turnlog.application.errors import LeaseLost
from turnlog.application.execution.cancel_watch import POLL_SECONDS, utc_now
from turnlog.application.execution.fencing import HeldSteps, LeaseCheck, Unleased
from turnlog.application.execution.tool_step import Started, ToolStep
from turnlog.application.log_context import bound
from turnlog.application.observer import Observer, Unobserved, cancel_kind
from turnlog.application.providers.port import ModelReply, ProviderError, ProviderRegistry
from turnlog.application.providers.reply_deltas import DeltaHub
from turnlog.application.sessions import Sessions, Submitted
from turnlog.application.tools.port import ToolRegistry
from turnlog.application.tools.probes import owner_identity
from turnlog.application.tracing import Tracer, Untraced, usage_attributes
from turnlog.domain import errors as domain_errors
from turnlog.domain.progress import Action, next_step
from turnlog.domain.session import Session
from turnlog.domain.turns import Effect, FinishedTurn, ToolCall, Turn, TurnState

log = logging.getLogger("turnlog.execution")


@dataclass
class Executor(ToolStep):
    """Runs turns in this process on behalf of one worker id."""

    sessions: Sessions
    providers: ProviderRegistry
    tools: ToolRegistry
    worker_id: str
    sandbox_root: Path
    max_steps: int = 8
    observer: Observer = field(default_factory=Unobserved)
    # Spans of turns, model calls and tool calls (interface/tracing.py: OpenTelemetry).
    tracer: Tracer = field(default_factory=Untraced)
    namespace: str = "default"  # part of each tool call's idempotency key
    # Pieces of replies as they stream, for this process's live subscribers (never stored).
    deltas: DeltaHub = field(default_factory=DeltaHub)
    # Tools whose every call waits for an operator's approval (TURNLOG_APPROVAL_TOOLS).
    approval_tools: frozenset[str] = frozenset()
    # How often a worker running a tool looks for a cancel request (seconds).
    cancel_poll: float = POLL_SECONDS
    # This process's identity, recorded in each intent so that recovery never
    # probes a call while the process that ran it may still be alive.
    owner: dict[str, Any] = field(default_factory=owner_identity)
    # Safe outcomes applied but not saved yet: the turn's next save carries them.
    held: HeldSteps = field(default_factory=HeldSteps)

    def run_turn(
        self,
        session_id: UUID,
        turn_id: str,
        lease: LeaseCheck | None = None,
        stop: threading.Event | None = None,
        session: Session | None = None,
    ) -> Turn:
        """Claim the turn and run it until it completes, fails or is interrupted.

        When ``stop`` is set (a draining worker), the loop returns after the
        step in progress; the turn stays running without an owner, and whoever
        takes the lease next resumes it from the stored events. ``session``:
        the session as the caller just read it, which saves the claim a
        reload (a stale one costs a conflict and a reload, nothing more).
        """
        # Every line logged while the turn runs (the driver's included) names it.
        with bound(session_id=session_id, turn_id=turn_id, worker_id=self.worker_id):
            return self._run(session_id, turn_id, lease or Unleased(), stop, session)

    def _run(
        self,
        session_id: UUID,
        turn_id: str,
        lease: LeaseCheck,
        stop: threading.Event | None,
        current: Session | None,
    ) -> Turn:
        lease.check()
        (claim, session), _ = self.sessions.update(
            session_id, lambda s: (s.claim_turn(turn_id, self.worker_id), s), current=current
        )
        return self._run_claimed(session, turn_id, claim, lease, stop)

    def submit_and_run(
        self,
        session_id: UUID,
        message: str,
        idempotency_key: str = "",
        *,
        lease: LeaseCheck | None = None,
        stop: threading.Event | None = None,
        enqueue: bool = False,
        deadline_seconds: float | None = None,
    ) -> tuple[Submitted, Turn | None]:
        """Submit a message and run its turn here, the submission and the claim in one save.

        For a caller that runs what it submits (``Runtime.send``, holding the
        session's lease): one save fewer than ``submit_turn`` then ``run_turn``.
        The save is durable, as every submission's is. A turn that cannot
        start at once (queued behind another, or the turn an idempotency key
        already made) is submitted only, and the turn returned is None: the
        caller drives the session as after any submission.
        """
        lease = lease or Unleased()
        lease.check()
        claimed: list[tuple[int, Session]] = []

        def claim(s: Session, turn: Turn | FinishedTurn, created: bool) -> None:
            claimed.clear()  # decided again after a conflict
            if created and s.open_turn is turn:
                claimed.append((s.claim_turn(turn.turn_id, self.worker_id), s))

        with bound(session_id=session_id, worker_id=self.worker_id):
            submitted = self.sessions.submit_turn(
                session_id,
                message,
                idempotency_key,
                enqueue=enqueue,
                deadline_seconds=deadline_seconds,
                then=claim,
            )
            if not claimed:
                return submitted, None
            number, session = claimed[0]
            with bound(turn_id=submitted.turn_id):
                return submitted, self._run_claimed(session, submitted.turn_id, number, lease, stop)

    def _run_claimed(
        self,
        session: Session,
        turn_id: str,
        claim: int,
        lease: LeaseCheck,
        stop: threading.Event | None,
    ) -> Turn:
        session_id = session.id
        self.observer.turn_claimed(claim)
        log.info("claimed turn (claim %d)", claim)
        # A lock dropped with its connection while we live is taken back, and
        # kept only if no one claimed the turn meanwhile (application/execution/leases.py).
        lease.guard(lambda: self._still_ours(session_id, turn_id, claim))
        # The submitter's trace, kept with the turn: its span joins it in any process.
        traceparent = session.turn(turn_id).traceparent
        try:
            with self.tracer.turn(str(session_id), turn_id, traceparent) as span:
                turn = self._steps(session, turn_id, claim, lease, stop)
                span.set({"turnlog.turn.state": str(turn.state), "turnlog.turn.claim": claim})
                if turn.state in (TurnState.FAILED, TurnState.INTERRUPTED):
                    span.fail(str(turn.state))
                return turn
        finally:
            lease.guard(None)
            self.held.drop(session_id)

    def _still_ours(self, session_id: UUID, turn_id: str, claim: int) -> bool:
        """Whether the turn is still running under our claim (read from the record)."""
        turn = self.sessions.get_session(session_id).open_turn
        return (
            turn is not None
            and turn.turn_id == turn_id
            and turn.state is TurnState.RUNNING
            and turn.claim == claim
        )

    def _steps(
        self,
        session: Session,
        turn_id: str,
        claim: int,
        lease: LeaseCheck,
        stop: threading.Event | None,
    ) -> Turn:
        session_id = session.id
        turn: Turn | None = None
        while True:
            if not session.turn_state(turn_id).is_open:
                if turn is None:
                    # The session keeps only a summary of a finished turn: read it back.
                    turn = self.sessions.turn_record(session_id, turn_id)[1]
                self._report_end(turn)
                return turn
            session = self._cancel_expired_followups(session)
            turn = session.turn(turn_id)
            step = next_step(session, turn, self.max_steps, utc_now(), self._approval_rule(session))
            if step.action is Action.WAIT or (stop is not None and stop.is_set()):
                if session.pending_events:  # held steps: saved before the turn is let go
                    session = self._write(session, claim, lambda s: None)
                    turn = session.turn(turn_id)
                self._report_end(turn)
                return turn
            held = session
            session = self._take(
                session, turn, claim, step.action, step.call_id, step.reason, lease
            )
            if session is not held:
                # Reloaded on the way (a conflict, then a retry): the turn we held is not
                # the one saved. Otherwise the step's events were applied to it in place,
                # so when they ended it, it is the finished turn in full.
                turn = None

    def needs_approval(self, session: Session, call: ToolCall) -> bool:
        """Whether ``call`` must wait for an operator before it starts.

        The tool's own declaration (``approval = "required"``, or named in
        TURNLOG_APPROVAL_TOOLS) or the session's policy (``side_effecting``:
        calls of side-effecting tools; ``all``: every call).
        """
        tool = self.tools.get(call.name)
        if tool is None:
            return False  # not runnable here: the loop fails the turn instead
        if tool.spec.approval_required or call.name in self.approval_tools:
            return True
        policy = session.approval_policy
        return policy == "all" or (
            policy == "side_effecting" and tool.spec.effect is Effect.SIDE_EFFECTING
        )

    def _approval_rule(self, session: Session) -> Callable[[ToolCall], bool]:
        return lambda call: self.needs_approval(session, call)

    def _cancel_expired_followups(self, session: Session) -> Session:
        """Cancel follow-ups queued behind the running turn whose deadline has passed."""
        now = utc_now()
        reasons = {t.turn_id: t.cancel_due(now) for t in session.queued_turns()}
        expired = [turn_id for turn_id, reason in reasons.items() if reason]
        if not expired:
            return session

        def cancel(s: Session) -> Session:
            for turn_id in expired:
                s.finish_cancel(turn_id, now)
            return s

        session = self._save(session, cancel)[1]
        for turn_id in expired:
            self.observer.turn_ended("cancelled")
            self.observer.turn_cancelled(cancel_kind(reasons[turn_id]))
        return session

    def _report_end(self, turn: Turn) -> None:
        if turn.state is TurnState.COMPLETED:
            log.info("turn completed after %d model call(s)", len(turn.steps))
        elif turn.state is TurnState.FAILED:
            log.warning("turn failed: %s", turn.error)
        elif turn.state is TurnState.CANCELLED:
            log.info("turn cancelled (%s, by %s)", turn.reason, turn.actor)
            self.observer.turn_cancelled(cancel_kind(turn.reason))
        elif turn.state is TurnState.AWAITING_APPROVAL:
            log.info("turn awaits an operator's approval; letting it go")
            return
        else:
            return  # still running (draining) or waiting: not ended here
        self.observer.turn_ended(str(turn.state))

    def _take(
        self,
        session: Session,
        turn: Turn,
        claim: int,
        action: Action,
        call_id: str,
        reason: str,
        lease: LeaseCheck,
    ) -> Session:
        tid = turn.turn_id
        if action is Action.CALL_MODEL:
            return self._call_model(session, tid, claim, lease)
        if action in (Action.RUN_TOOL, Action.RERUN_TOOL):
            return self._run_tool(session, tid, claim, call_id, lease)
        if action is Action.COMPLETE:
            text = turn.steps[-1].text
            return self._write(session, claim, lambda s: s.complete_turn(tid, claim, text))
        if action is Action.FAIL:
            return self._write(session, claim, lambda s: s.fail_turn(tid, claim, reason))
        if action is Action.CANCEL:
            now = utc_now()
            return self._write(session, claim, lambda s: s.finish_cancel(tid, now, claim))
        if action is Action.PROPOSE:
            log.info("tool call %s proposed for approval", call_id)
            return self._write(session, claim, lambda s: s.propose_tool_call(tid, claim, call_id))
        if action is Action.INTERRUPT:
            # Only recovery interrupts; our own claim never leaves an unsafe call
            # in flight between steps, so reaching this means our state is stale.
            raise LeaseLost(f"turn {tid} has an unsafe call in flight from another owner")
        raise AssertionError(f"unhandled action {action}")

    def _call_model(self, session: Session, turn_id: str, claim: int, lease: LeaseCheck) -> Session:
        session = self._compact_context(session, turn_id, claim)
        if not session.turn_state(turn_id).is_open:
            return session  # summarising failed: the turn failed with the reason
        request = self.sessions.request_for(session)
        started = time.monotonic()
        step = len(session.turn(turn_id).steps) + 1  # the step ModelReplied will record
        with self.tracer.model_call(session.provider, request.model) as span:
            try:
                with self.deltas.streaming(session.id, turn_id, step):
                    reply = self.providers.get(session.provider).complete(request)
            except ProviderError as exc:
                span.fail("provider_error")
                self.observer.model_called(session.provider, "error", time.monotonic() - started)
                reason = f"provider error: {exc}"
                return self._write(session, claim, lambda s: s.fail_turn(turn_id, claim, reason))
            span.set(usage_attributes(reply.usage))
        seconds = time.monotonic() - started
        self.observer.model_called(session.provider, "replied", seconds)
        self.observer.tokens_used(session.provider, reply.usage)
        log.info("model replied in %.3fs with %d tool call(s)", seconds, len(reply.tool_calls))
        problem = self._reply_problem(session, reply)
        begun: list[Started | None] = [None]

        def record(s: Session) -> None:
            begun[0] = None  # decided again after a conflict
            try:
                s.record_model_reply(turn_id, claim, reply.text, reply.tool_calls, reply.usage)
            except (domain_errors.DuplicateToolCall, domain_errors.InvalidInput) as exc:
                s.fail_turn(turn_id, claim, f"invalid model reply: {exc.detail}")
                return
            if problem:
                s.fail_turn(turn_id, claim, problem)
            elif not reply.tool_calls:
                s.complete_turn(turn_id, claim, reply.text)
            else:  # the first call's intent goes in the same save, when it may start now
                begun[0] = self._start_now(s, turn_id, claim)

        session = self._write(session, claim, record)
        if begun[0] is None:
            return session
        return self._run_started(session, turn_id, claim, begun[0], lease)

    def _compact_context(self, session: Session, turn_id: str, claim: int) -> Session:
        """Record the context summary the next request needs first (docs/long-sessions.md).

        The summary is saved before the request is built: a process that dies
        after it resumes with the same summary instead of making another. A
        provider that cannot summarise fails the turn with the reason; nothing
        else is written.
        """
        planned = self.sessions.compaction_for(session)
        if planned is None:
            return session
        request, turns = planned
        started = time.monotonic()
        try:
            reply = self.providers.get(session.provider).complete(request)
        except ProviderError as exc:
            self.observer.model_called(session.provider, "error", time.monotonic() - started)
            reason = f"context compaction failed: provider error: {exc}"
            return self._write(session, claim, lambda s: s.fail_turn(turn_id, claim, reason))
        self.observer.model_called(session.provider, "replied", time.monotonic() - started)
        produced_by = {"provider": session.provider, "model": session.model, "usage": reply.usage}

        def record(s: Session) -> None:
            try:
                s.compact_context(turn_id, claim, reply.text, turns, produced_by)
            except (domain_errors.InvalidSummary, domain_errors.InvalidInput) as exc:
                s.fail_turn(turn_id, claim, f"context compaction failed: {exc.detail}")

        log.info("context compacted: a summary now covers %d turn(s)", turns)
        return self._write(session, claim, record)

    def _reply_problem(self, session: Session, reply: ModelReply) -> str:
        """Why a reply cannot be carried out (an unknown tool), or ''."""
        for call in reply.tool_calls:
            name = str(call.get("name", ""))
            if self.tools.get(name) is None or not session.allows_tool(name):
                return f"the model asked for unknown tool {name!r}"
        return ""
