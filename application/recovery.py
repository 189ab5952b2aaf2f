"""Recovery: what to do with an open turn whose owner may be gone.

The rules (DESIGN §5), decided from the stored events alone:

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
  if the probe cannot tell (application/settling.py).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from turnlog.domain.progress import Action, next_step
from turnlog.domain.session import Session
from turnlog.domain.turns import Turn, TurnState


class Decision(StrEnum):
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


PLANNED = {
    Decision.START: "to start",
    Decision.RESUME: "to resume",
    Decision.RERUN: "to re-run",
    Decision.INTERRUPT: "to interrupt",
    Decision.PROBE: "to probe",
    Decision.FAIL: "to fail",
    Decision.LEAVE_OWNER_ALIVE: "left to a live owner",
    Decision.LEAVE_FOR_OPERATOR: "waiting for an operator",
    Decision.LEAVE_FOR_APPROVAL: "awaiting approval",
    Decision.CANCEL: "to cancel",
}
DONE = PLANNED | {
    Decision.START: "started",
    Decision.RESUME: "resumed",
    Decision.RERUN: "re-run",
    Decision.INTERRUPT: "interrupted",
    Decision.PROBE: "probed",
    Decision.FAIL: "failed",
    Decision.CANCEL: "cancelled",
}


def summarize(verdicts: list[Verdict], done: bool = False) -> str:
    """One line such as '3 open turns: 1 to resume, 1 to re-run, 1 to interrupt'.

    Decisions are worded as plans ("to interrupt") unless ``done`` says they
    were carried out ("interrupted"): a check that has not acted yet must not
    read as if it had.
    """
    if not verdicts:
        return "0 open turns"
    words = DONE if done else PLANNED
    counts: dict[str, int] = {}
    for v in verdicts:
        counts[words[v.decision]] = counts.get(words[v.decision], 0) + 1
    parts = ", ".join(f"{n} {w}" for w, n in counts.items())
    noun = "turn" if len(verdicts) == 1 else "turns"
    return f"{len(verdicts)} open {noun}: {parts}"
