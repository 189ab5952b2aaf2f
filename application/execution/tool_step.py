"""The agent loop's tool-call step: record the intent, run the tool, record its outcome.

ToolCallStarted is committed before the tool runs, with what a probe will
need if this process dies mid-call; the outcome (succeeded, failed, or
unknown when the tool's other side died) is saved under the same claim. A
part of ``Executor`` (application/execution/loop.py), which holds the fields
declared here.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

from turnlog.application.errors import LeaseLost
from turnlog.application.execution.cancel_watch import CancelWatch, utc_now
from turnlog.application.execution.fencing import Fenced, LeaseCheck
from turnlog.application.log_context import bound
from turnlog.application.observer import Observer
from turnlog.application.tools.context import ToolContext
from turnlog.application.tools.errors import (
    MAX_ERROR_CHARS,
    error_text,
    log_text,
    shorten,
    without_paths,
)
from turnlog.application.tools.port import ToolError, ToolOutcomeUnknown, ToolRegistry
from turnlog.application.tools.probes import prober_of
from turnlog.application.tools.sandbox_files import SandboxPathError, ensure_sandbox
from turnlog.application.tracing import Tracer
from turnlog.domain import errors as domain_errors
from turnlog.domain.progress import Action, next_step
from turnlog.domain.session import Session
from turnlog.domain.turns import Effect, ToolCall, ToolProcess
from turnlog.domain.values import check_storable, storable_text

log = logging.getLogger("turnlog.execution")


class Started(NamedTuple):
    """A call whose intent a save just recorded, and the tool that runs it next."""

    call_id: str
    attempt: int
    effect: Effect
    tool: Any


class ToolStep(Fenced):
    """Runs one tool call of a turn (a base of the agent loop's Executor)."""

    tools: ToolRegistry
    max_steps: int
    worker_id: str
    sandbox_root: Path
    observer: Observer
    tracer: Tracer
    namespace: str
    cancel_poll: float
    owner: dict[str, Any]

    def _approval_rule(self, session: Session) -> Callable[[ToolCall], bool]:
        raise NotImplementedError  # the Executor's: which calls wait for an operator

    def _run_tool(
        self, session: Session, turn_id: str, claim: int, call_id: str, lease: LeaseCheck
    ) -> Session:
        with bound(call_id=call_id):
            return self._run_call(session, turn_id, claim, call_id, lease)

    def _run_call(
        self, session: Session, turn_id: str, claim: int, call_id: str, lease: LeaseCheck
    ) -> Session:
        tool = self.tools.get(session.call(call_id).name)
        if tool is None:
            reason = f"tool {session.call(call_id).name!r} is not available in this process"
            return self._write(session, claim, lambda s: s.fail_turn(turn_id, claim, reason))
        # What a probe will need if we die mid-call goes into the intent itself.
        pre_state = self._pre_state(tool, session, call_id)
        try:
            # On a conflict the write decides again on the session as stored: a cancel
            # recorded meanwhile refuses the start (the next step then ends the turn).
            started, session = self._write_result(
                session, claim, lambda s: self._start(s, turn_id, claim, call_id, tool, pre_state)
            )
        except domain_errors.CancelPending:
            log.info("tool call %s not started: its turn's cancel is on record", call_id)
            return self.sessions.get_session(session.id)
        return self._perform_call(session, turn_id, claim, started, lease)

    def _start(
        self,
        session: Session,
        turn_id: str,
        claim: int,
        call_id: str,
        tool: Any,
        pre_state: dict[str, Any],
    ) -> Started:
        """Record the call's intent on ``session`` (the caller saves it)."""
        call = session.call(call_id)
        effect = Effect(call.effect) if call.effect else tool.spec.effect
        attempt = session.start_tool_call(
            turn_id, claim, call_id, self.worker_id, effect, pre_state, self.owner
        )
        return Started(call_id, attempt, effect, tool)

    def _start_now(self, session: Session, turn_id: str, claim: int) -> Started | None:
        """Record the intent of the call the turn runs next, in the caller's save, if any.

        Called by the model step after it recorded a reply that asks for tools:
        when the next step is to run a call (no approval, no cancel, a tool of
        this process), its intent goes in the same save as the reply, one
        durable commit for both (docs/durability.md). None: nothing started,
        and the loop decides the next step as usual.
        """
        step = next_step(
            session, session.turn(turn_id), self.max_steps, utc_now(), self._approval_rule(session)
        )
        tool = self.tools.get(session.call(step.call_id).name) if step.call_id else None
        if step.action is not Action.RUN_TOOL or tool is None:
            return None
        pre_state = self._pre_state(tool, session, step.call_id)
        try:
            return self._start(session, turn_id, claim, step.call_id, tool, pre_state)
        except domain_errors.CancelPending:
            return None

    def _run_started(
        self, session: Session, turn_id: str, claim: int, started: Started, lease: LeaseCheck
    ) -> Session:
        """Run a call whose intent the caller's save committed (``_start_now``)."""
        with bound(call_id=started.call_id):
            return self._perform_call(session, turn_id, claim, started, lease)

    def _perform_call(
        self, session: Session, turn_id: str, claim: int, started: Started, lease: LeaseCheck
    ) -> Session:
        """Run a call whose intent is committed, and save its outcome."""
        call_id, attempt, effect, tool = started
        call = session.call(call_id)
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

            def record(s: Session) -> None:
                s.record_tool_succeeded(turn_id, claim, call_id, attempt, value)

        else:
            error = self._public_error(str(value), context.sandbox)

            def record(s: Session) -> None:
                s.record_tool_failed(turn_id, claim, call_id, attempt, error)

        if effect.safe_to_repeat and self.sessions.riding:
            # Lost, the call runs again: the turn's next save carries it (domain/durability.py).
            return self._hold(session, claim, record)
        return self._write(session, claim, record)

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
        self.observer.tool_started(name)
        started = time.monotonic()
        outcome = "lost"  # unless the tool returns: ownership was lost while it ran
        try:
            with self.tracer.tool_call(name, context.call_id) as span:
                # The tool's processes join the trace (TRACEPARENT in their environment).
                context = replace(context, traceparent=self.tracer.traceparent())
                outcome, value = self._invoke(tool, arguments, context)
                if outcome != "succeeded":
                    span.fail(outcome)
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
