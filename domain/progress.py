"""What a turn needs next, decided from the session's state alone.

The agent loop and recovery both ask this question; keeping the answer pure
means a resumed turn takes exactly the step an uninterrupted one would have.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from turnlog.domain.session import Session, probed_not_applied
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
