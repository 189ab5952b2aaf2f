"""The agent loop: run one turn, step by step, each step durably recorded.

claim → request → ModelReplied → for each tool call: ToolCallStarted
(committed) → run the tool → ToolCallSucceeded/Failed (committed) → next
request … → TurnCompleted. Slow work (the model, a tool) never runs inside a
database transaction: every save is its own short transaction.

The loop asks ``domain.progress.next_step`` what to do, so a turn resumed
after a crash takes exactly the step an uninterrupted run would have taken.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar
from uuid import UUID

from turnlog.application.errors import ConcurrentModification, LeaseLost
from turnlog.application.execution.cancel_watch import POLL_SECONDS, CancelWatch, utc_now
from turnlog.application.log_context import bound
from turnlog.application.observer import Observer, Unobserved, cancel_kind
from turnlog.application.providers.port import ModelReply, ProviderError, ProviderRegistry
from turnlog.application.providers.reply_deltas import DeltaHub
from turnlog.application.sessions import Sessions
from turnlog.application.tools.context import ToolContext
from turnlog.application.tools.errors import (
    MAX_ERROR_CHARS,
    error_text,
    log_text,
    shorten,
    without_paths,
)
from turnlog.application.tools.port import ToolError, ToolOutcomeUnknown, ToolRegistry
from turnlog.application.tools.probes import owner_identity, prober_of
from turnlog.application.tools.sandbox_files import SandboxPathError, ensure_sandbox
from turnlog.domain import errors as domain_errors
from turnlog.domain.progress import Action, next_step
from turnlog.domain.session import Session
from turnlog.domain.turns import Effect, ToolCall, ToolProcess, Turn, TurnState
from turnlog.domain.values import check_storable, storable_text

T = TypeVar("T")
log = logging.getLogger("turnlog.execution")


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


@dataclass
class Executor:
    """Runs turns in this process on behalf of one worker id."""

    sessions: Sessions
    providers: ProviderRegistry
    tools: ToolRegistry
    worker_id: str
    sandbox_root: Path
    max_steps: int = 8
    observer: Observer = field(default_factory=Unobserved)
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
        self.observer.turn_claimed(claim)
        log.info("claimed turn (claim %d)", claim)
        # A lock dropped with its connection while we live is taken back, and
        # kept only if no one claimed the turn meanwhile (application/execution/leases.py).
        lease.guard(lambda: self._still_ours(session_id, turn_id, claim))
        try:
            return self._steps(session, turn_id, claim, lease, stop)
        finally:
            lease.guard(None)

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

        session = self.sessions.update(session.id, cancel, current=session)[0]
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
            return self._call_model(session, tid, claim)
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

    def _call_model(self, session: Session, turn_id: str, claim: int) -> Session:
        session = self._compact_context(session, turn_id, claim)
        if not session.turn_state(turn_id).is_open:
            return session  # summarising failed: the turn failed with the reason
        request = self.sessions.request_for(session)
        started = time.monotonic()
        step = len(session.turn(turn_id).steps) + 1  # the step ModelReplied will record
        try:
            with self.deltas.streaming(session.id, turn_id, step):
                reply = self.providers.get(session.provider).complete(request)
        except ProviderError as exc:
            self.observer.model_called(session.provider, "error", time.monotonic() - started)
            reason = f"provider error: {exc}"
            return self._write(session, claim, lambda s: s.fail_turn(turn_id, claim, reason))
        seconds = time.monotonic() - started
        self.observer.model_called(session.provider, "replied", seconds)
        log.info("model replied in %.3fs with %d tool call(s)", seconds, len(reply.tool_calls))
        problem = self._reply_problem(session, reply)

        def record(s: Session) -> None:
            try:
                s.record_model_reply(turn_id, claim, reply.text, reply.tool_calls, reply.usage)
            except (domain_errors.DuplicateToolCall, domain_errors.InvalidInput) as exc:
                s.fail_turn(turn_id, claim, f"invalid model reply: {exc.detail}")
                return
            if problem:
                s.fail_turn(turn_id, claim, problem)
            elif not reply.tool_calls:
                s.complete_turn(turn_id, claim, reply.text)

        return self._write(session, claim, record)

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

    def _run_tool(
        self, session: Session, turn_id: str, claim: int, call_id: str, lease: LeaseCheck
    ) -> Session:
        with bound(call_id=call_id):
            return self._run_call(session, turn_id, claim, call_id, lease)

    def _run_call(
        self, session: Session, turn_id: str, claim: int, call_id: str, lease: LeaseCheck
    ) -> Session:
        call = session.call(call_id)
        tool = self.tools.get(call.name)
        if tool is None:
            reason = f"tool {call.name!r} is not available in this process"
            return self._write(session, claim, lambda s: s.fail_turn(turn_id, claim, reason))
        effect = Effect(call.effect) if call.effect else tool.spec.effect
        # What a probe will need if we die mid-call goes into the intent itself.
        pre_state = self._pre_state(tool, session, call_id)
        attempt, session = self._write_result(
            session,
            claim,
            lambda s: s.start_tool_call(
                turn_id, claim, call_id, self.worker_id, effect, pre_state, self.owner
            ),
        )
        # The intent is committed. Check ownership once more right before the
        # side effect: a worker that lost its lease while paused must not act.
        lease.check()
        # A tool that spawns a process reports it through the context; recording
        # it saves an event, so the session object may be replaced meanwhile.
        current = [session]

        def report_process(process: ToolProcess) -> None:
            current[0] = self._write(
                current[0],
                claim,
                lambda s: s.record_tool_process(turn_id, claim, call_id, attempt, process),
            )
            if context.stop.is_set():
                # The call was stopped before this process was recorded: the
                # watcher did not see it, so it must not start (its gate stays shut).
                raise ToolError(f"{call.name}: stopped before it started")

        context = self._context(session, call_id, attempt, report_process)
        watch = CancelWatch(
            self.sessions,
            session.id,
            turn_id,
            call_id,
            attempt,
            effect,
            context.stop,
            session.turn(turn_id).deadline_at,
            self.cancel_poll,
            version=session.version,
        )
        with watch:
            outcome, value = self._timed_invoke(tool, call.name, call.arguments, context)
        # Ours still? A lease dropped while the tool ran has been taken back if
        # no one claimed the turn meanwhile; otherwise the result is not ours to record.
        lease.check()
        session = current[0]
        if watch.killed:
            return self._stopped(session, turn_id, claim, effect)
        if outcome == "unknown":
            return self._outcome_unknown(session, turn_id, claim, effect, str(value))
        if outcome == "succeeded":
            return self._write(
                session,
                claim,
                lambda s: s.record_tool_succeeded(turn_id, claim, call_id, attempt, value),
            )
        return self._write(
            session,
            claim,
            lambda s: s.record_tool_failed(
                turn_id, claim, call_id, attempt, self._public_error(str(value), context.sandbox)
            ),
        )

    def _stopped(self, session: Session, turn_id: str, claim: int, effect: Effect) -> Session:
        """The call was stopped mid-run because its turn must stop (cancel or deadline).

        A safe call is recorded cancelled with its turn. A side-effecting one
        (only a forced cancel stops it) may have acted or not: the turn is
        interrupted, as when any owner dies mid-call, until an operator says.
        """
        if effect.safe_to_repeat:
            now = utc_now()
            stopped = self._write(session, claim, lambda s: s.finish_cancel(turn_id, now, claim))
            return stopped
        interrupted = self._write(
            session, claim, lambda s: s.interrupt_turn(turn_id, self.worker_id, self.worker_id)
        )
        log.warning("side-effecting tool call killed by a forced cancel: outcome unknown")
        self.observer.turn_ended("interrupted")
        return interrupted

    def _pre_state(self, tool: Any, session: Session, call_id: str) -> dict[str, Any]:
        """The tool's probe's pre-state for the attempt about to start ({} when none)."""
        prober = prober_of(tool)
        if prober is None:
            return {}
        call = session.call(call_id)
        context = ToolContext(
            str(session.id),
            call_id,
            call.attempt + 1,
            self.sandbox_root / str(session.id),
            namespace=self.namespace,
        )
        try:
            state = json.loads(json.dumps(prober.prepare(call.arguments, context)))
            check_storable(state, "the probe's pre-state")
        except Exception as exc:  # no pre-state: a probe will answer unknown
            log.warning("probe pre-state not recorded: %s", log_text(exc))
            return {}
        return state if isinstance(state, dict) else {}

    def _outcome_unknown(
        self, session: Session, turn_id: str, claim: int, effect: Effect, reason: str
    ) -> Session:
        """The tool's other side died mid-call: the rules for an owner that died mid-call.

        The call stays in flight. A call safe to repeat is run again by the
        loop's next step (attempts bounded); any other interrupts the turn
        until an operator says what happened.
        """
        log.warning("tool call outcome unknown: %s", shorten(reason, MAX_ERROR_CHARS))
        if effect.safe_to_repeat:
            return session
        interrupted = self._write(
            session, claim, lambda s: s.interrupt_turn(turn_id, self.worker_id, self.worker_id)
        )
        self.observer.turn_ended("interrupted")
        return interrupted

    def _context(
        self,
        session: Session,
        call_id: str,
        attempt: int,
        report_process: Callable[[ToolProcess], None],
    ) -> ToolContext:
        sandbox = self.sandbox_root / str(session.id)
        # A link in the sandbox's place is refused here and again by every tool
        # that opens the sandbox (they open it without following links).
        with contextlib.suppress(SandboxPathError):
            ensure_sandbox(sandbox)
        return ToolContext(
            str(session.id), call_id, attempt, sandbox, report_process, self.namespace
        )

    def _public_error(self, text: str, sandbox: Path) -> str:
        """A tool's error as it may leave the process: short, no host path, storable.

        It is stored, shown by the API and sent to the model; an OSError's
        message names the absolute path of the sandbox, which none of them needs.
        """
        places = [(str(sandbox), "<sandbox>"), (str(self.sandbox_root), "<sandboxes>")]
        if self.sandbox_root.parent.name == "sandboxes":
            places.append((str(self.sandbox_root.parent.parent), "<data dir>"))
        return storable_text(shorten(without_paths(text, places), MAX_ERROR_CHARS))

    def _timed_invoke(
        self, tool: Any, name: str, arguments: dict[str, Any], context: ToolContext
    ) -> tuple[str, Any]:
        started = time.monotonic()
        outcome = "lost"  # unless the tool returns: ownership was lost while it ran
        try:
            outcome, value = self._invoke(tool, arguments, context)
            return outcome, value
        finally:
            seconds = time.monotonic() - started
            self.observer.tool_called(name, outcome, seconds)
            log.info("tool %s %s in %.3fs (attempt %d)", name, outcome, seconds, context.attempt)

    def _invoke(
        self, tool: Any, arguments: dict[str, Any], context: ToolContext
    ) -> tuple[str, Any]:
        try:
            result = tool.run(arguments, context)
            # Results are stored as JSON: anything else is rendered as text. A
            # result the record cannot hold (a lone surrogate, nesting too deep)
            # fails the call instead of failing every save of it, forever.
            value = json.loads(json.dumps(result, default=str))
            check_storable(value, "the tool's result")
            return "succeeded", value
        except ToolError as exc:
            return "failed", str(exc)
        except ToolOutcomeUnknown as exc:
            return "unknown", str(exc)
        except LeaseLost:
            # Reporting a spawned process found the turn no longer ours: not the
            # tool's failure, and nothing more may be recorded under this claim.
            raise
        except Exception as exc:  # a tool's own bug is that call's failure
            # Bounded: one tool's chain of exceptions once made a 3 MB log record.
            log.warning("tool raised: %s", log_text(exc))
            return "failed", error_text(exc)

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
