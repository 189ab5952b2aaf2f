"""Recovery's use of probes: settle a side-effecting call in flight from evidence.

Called by recovery (``Runtime.recover``) with the session's lease held, for
a running turn whose owner died inside a side-effecting call of a tool that
declares a probe. In order:

1. claim the turn — the dead owner's claim is fenced from here on;
2. check that neither the owner process nor any process of the attempt is
   still alive (``probes.still_acting``); if one may be, run no probe and
   interrupt the turn as recovery always did;
3. run the probe (outside any transaction) and record ``ToolCallProbed``
   with, in the same save, what follows from its answer:
   ``applied`` → ToolCallResolved succeeded with the probe's result;
   ``not_applied`` → ToolCallResolved failed ("not applied (probe)"), unless
   the tool declares ``rerun_when_not_applied`` and attempts remain, in which
   case the call runs again (same idempotency key, next attempt);
   ``unknown`` → TurnInterrupted: an operator decides, the probe's note in view.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from uuid import UUID

from turnlog.application.execution.fencing import LeaseCheck
from turnlog.application.execution.loop import Executor
from turnlog.application.tools.probes import probe_context, prober_of, run_probe, still_acting
from turnlog.domain.session import Session
from turnlog.domain.turns import MAX_TOOL_ATTEMPTS, ProbeAnswer

log = logging.getLogger("turnlog.probes")


@dataclass(frozen=True)
class Settled:
    """How a probe settled a call: answer ('' when none ran), what was done, why."""

    answer: str
    action: str  # resolved | re-run | interrupted
    detail: str

    @property
    def interrupted(self) -> bool:
        return self.action == "interrupted"


def settle_by_probe(
    executor: Executor, session_id: UUID, turn_id: str, call_id: str, lease: LeaseCheck
) -> Settled:
    """Claim the turn, probe the call in flight, record the probe and its consequence."""
    lease.check()
    (claim, session), _ = executor.sessions.update(
        session_id, lambda s: (s.claim_turn(turn_id, executor.worker_id), s)
    )
    call = session.call(call_id)
    tool = executor.tools.get(call.name)
    prober = prober_of(tool) if tool is not None else None
    busy = still_acting(call) if prober is not None else f"tool {call.name!r} has no probe here"
    if busy:
        log.warning("no probe for call %s: %s", call_id, busy)
        _interrupt(executor, session, turn_id)
        return Settled("", "interrupted", f"no probe run: {busy}")
    assert prober is not None
    sandbox = executor.sandbox_root / str(session_id)
    context = probe_context(str(session_id), call, sandbox, executor.namespace)
    report, seconds = run_probe(prober, call.arguments, context, call.pre_state)
    log.info("probe of %s answered %s in %.3fs: %s", call.name, report.answer, seconds, report.note)
    lease.check()
    rerun = (
        report.answer is ProbeAnswer.NOT_APPLIED
        and prober.rerun_when_not_applied
        and call.attempt < MAX_TOOL_ATTEMPTS
    )

    def record(s: Session) -> None:
        s.record_probe(
            turn_id,
            claim,
            call_id,
            report.answer,
            report.evidence,
            report.note,
            seconds,
            executor.worker_id,
        )
        if report.answer is ProbeAnswer.UNKNOWN:
            s.interrupt_turn(turn_id, call.worker_id, executor.worker_id)
        elif not rerun:
            s.resolve_by_probe(turn_id, claim, call_id, report.result)

    executor.sessions.update(session_id, record, current=session)
    if report.answer is ProbeAnswer.UNKNOWN:
        executor.observer.turn_ended("interrupted")
        return Settled(str(report.answer), "interrupted", report.note)
    return Settled(str(report.answer), "re-run" if rerun else "resolved", report.note)


def _interrupt(executor: Executor, session: Session, turn_id: str) -> None:
    """Interrupt as recovery always did; the dead owner is the one that started the call."""
    in_flight = session.in_flight_calls(session.turn(turn_id))
    previous = in_flight[0].worker_id if in_flight else ""
    executor.sessions.update(
        session.id,
        lambda s: s.interrupt_turn(turn_id, previous, executor.worker_id),
        current=session,
    )
    executor.observer.turn_ended("interrupted")
