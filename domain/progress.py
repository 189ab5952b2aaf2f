"""What a turn needs next, decided from the session's state alone.

The agent loop asks ``next_step``; recovery asks ``decide`` about an open turn
whose owner may be gone, and ``decide`` asks ``next_step`` in turn. Keeping
both answers pure means a resumed turn takes exactly the step an
uninterrupted one would have.

Recovery's rules (docs/recovery.md), decided from the stored events alone:

- owner holds the lease → leave it alone;
- interrupted → leave it: an operator must abandon it or resolve its calls;
- queued → start it (cancel it if its deadline has passed);
- awaiting approval → leave it for an operator (cancel it past its deadline);
- a cancel request or a passed deadline → stop the turn (below, a
  side-effecting call in flight still interrupts it first);
- running, no call in flight → resume (a model call has no side effect);
- running, a read_only/idempotent call in flight → re-run it (same call id,
  attempt + 1, bounded);
- running, a side_effecting call in flight → interrupt: its outcome is
  unknown, and nothing runs until an operator acts — unless its tool
  declares a probe (and probes are on): then probe first, and interrupt only
  if the probe cannot tell (application/execution/settling.py).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from turnlog.domain.events import probed_not_applied
from turnlog.domain.session import Session
from turnlog.domain.turns import MAX_TOOL_ATTEMPTS, Effect, ToolCall, Turn, TurnState


class Action(StrEnum):
    """The next thing to do for a running turn."""

    CALL_MODEL = "call_model"
    RUN_TOOL = "run_tool"  # a requested call that has not started
    RERUN_TOOL = "rerun_tool"  # a safe call whose attempt never reported
    INTERRUPT = "interrupt"  # an unsafe call whose attempt never reported
    COMPLETE = "complete"
    FAIL = "fail"
    CANCEL = "cancel"  # an operator asked to stop, or the deadline passed
    PROPOSE = "propose"  # a requested call needs an operator's approval first
    WAIT = "wait"  # nothing to do: the turn is not running (queued, finished, interrupted)


@dataclass(frozen=True)
class NextStep:
    """The action, the call it concerns (if any) and a reason for failures."""

    action: Action
    call_id: str = ""
    reason: str = ""


def next_step(
    session: Session,
    turn: Turn,
    max_steps: int,
    now: datetime | None = None,
    needs_approval: Callable[[ToolCall], bool] | None = None,
) -> NextStep:
    """Decide the next step of a running turn whose previous owner is gone or is us.

    ``now`` lets a passed deadline stop the turn; ``needs_approval`` says which
    requested calls must be proposed to an operator before they start.
    """
    if turn.state is not TurnState.RUNNING:
        return NextStep(Action.WAIT)
    in_flight = session.in_flight_calls(turn)
    # A side-effecting call a probe proved had no effect may run again (the
    # recovering process decided so: its tool declares rerun_when_not_applied).
    unsafe = [
        c for c in in_flight if not Effect(c.effect).safe_to_repeat and not probed_not_applied(c)
    ]
    if unsafe:
        return NextStep(Action.INTERRUPT, unsafe[0].call_id)
    reason = turn.cancel_due(now)
    if reason:
        # A safe call in flight is stopped with the turn (never re-run).
        return NextStep(Action.CANCEL, reason=reason)
    if in_flight:
        call = in_flight[0]
        if call.attempt >= MAX_TOOL_ATTEMPTS:
            return NextStep(
                Action.FAIL,
                call.call_id,
                f"tool call {call.call_id} ({call.name}) did not report after "
                f"{call.attempt} attempts",
            )
        return NextStep(Action.RERUN_TOOL, call.call_id)
    pending = session.pending_calls(turn)
    if pending:
        call = pending[0]
        if call.approval != "approved" and needs_approval is not None and needs_approval(call):
            return NextStep(Action.PROPOSE, call.call_id)
        return NextStep(Action.RUN_TOOL, call.call_id)
    if turn.steps and not turn.steps[-1].call_ids:
        return NextStep(Action.COMPLETE)
    if len(turn.steps) >= max_steps:
        return NextStep(Action.FAIL, reason=f"step limit reached ({max_steps} model calls)")
    return NextStep(Action.CALL_MODEL)


class Decision(StrEnum):
    """What recovery does with an open turn whose owner may be gone."""

    START = "start"
    RESUME = "resume"
    RERUN = "re-run"
    INTERRUPT = "interrupt"
    PROBE = "probe"
    FAIL = "fail"
    LEAVE_OWNER_ALIVE = "leave: owner alive"
    LEAVE_FOR_OPERATOR = "leave: waiting for an operator"
    LEAVE_FOR_APPROVAL = "leave: awaiting approval"
    CANCEL = "cancel"  # a cancel request or a passed deadline


@dataclass(frozen=True)
class Verdict:
    """The decision for one open turn, with what it concerns."""

    session_id: str
    turn_id: str
    state: str
    decision: Decision
    call_id: str = ""
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "turn_id": self.turn_id,
            "state": self.state,
            "decision": str(self.decision),
            "call_id": self.call_id,
            "detail": self.detail,
        }


def decide(
    session: Session,
    turn: Turn,
    owner_alive: bool,
    max_steps: int,
    probes: Collection[str] = (),
    now: datetime | None = None,
) -> Verdict:
    """The recovery decision for an open turn; ``probes``: the tools whose probe recovery asks."""

    def verdict(decision: Decision, call_id: str = "", detail: str = "") -> Verdict:
        return Verdict(str(session.id), turn.turn_id, str(turn.state), decision, call_id, detail)

    if owner_alive:
        return verdict(
            Decision.LEAVE_OWNER_ALIVE, detail=f"held by {turn.worker_id or 'a live process'}"
        )
    if turn.state is TurnState.INTERRUPTED:
        unknown = ", ".join(c.call_id for c in session.unknown_calls(turn))
        return verdict(Decision.LEAVE_FOR_OPERATOR, detail=f"unknown calls: {unknown}")
    # A cancel request, or a deadline passed at ``now``: stop the turn (a
    # side-effecting call in flight is still interrupted first, below).
    due = turn.cancel_due(now)
    if turn.state is TurnState.AWAITING_APPROVAL:
        if due:
            return verdict(Decision.CANCEL, detail=due)
        waiting = ", ".join(c.call_id for c in session.proposed_calls(turn))
        return verdict(Decision.LEAVE_FOR_APPROVAL, detail=f"proposed calls: {waiting}")
    if turn.state is TurnState.QUEUED:
        return verdict(Decision.CANCEL, detail=due) if due else verdict(Decision.START)
    step = next_step(session, turn, max_steps, now)
    if step.action is Action.CANCEL:
        return verdict(Decision.CANCEL, detail=step.reason)
    if step.action is Action.INTERRUPT:
        call = session.call(step.call_id)
        if call.name in probes:
            return verdict(
                Decision.PROBE, call.call_id, f"{call.name} ({call.effect}) was in flight; probe it"
            )
        return verdict(
            Decision.INTERRUPT, call.call_id, f"{call.name} ({call.effect}) was in flight"
        )
    if step.action is Action.RERUN_TOOL:
        call = session.call(step.call_id)
        return verdict(Decision.RERUN, call.call_id, f"{call.name} attempt {call.attempt + 1}")
    if step.action is Action.FAIL:
        return verdict(Decision.FAIL, step.call_id, step.reason)
    return verdict(Decision.RESUME)
