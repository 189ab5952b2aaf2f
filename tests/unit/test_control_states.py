"""Cancel, deadlines, approval and follow-ups in the Session aggregate (no database)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from turnlog.domain import errors
from turnlog.domain.progress import Action, next_step
from turnlog.domain.request import next_request
from turnlog.domain.session import Session, replay_turns
from turnlog.domain.turns import CallState, Effect, TurnState

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def replayed(session: Session, events: list[Any]) -> Session:
    """The same session rebuilt from its events alone."""
    copy: Any = None
    for event in events:
        copy = event.mutate(copy)
    assert isinstance(copy, Session)
    return copy


def state(session: Session) -> Any:
    return (
        [(t.turn_id, t.state, t.cancel_reason, t.deadline_at) for t in session.turns],
        {k: (c.state, c.arguments, c.approval, c.note) for k, c in session.calls.items()},
        session.finished,
        session.status,
    )


def running_with_call(name: str = "append_file", effect: Effect = Effect.SIDE_EFFECTING) -> Any:
    s = Session.start(tools=[name])
    turn, _ = s.submit_turn("go", deadline_at=T0 + timedelta(seconds=60))
    claim = s.claim_turn(turn.turn_id, "w1")
    s.record_model_reply(
        turn.turn_id, claim, "", [{"call_id": "c1", "name": name, "arguments": {}}]
    )
    return s, turn.turn_id, claim


def test_a_queued_turn_is_cancelled_at_once_and_replays_the_same() -> None:
    s = Session.start()
    turn, _ = s.submit_turn("hello")

    assert s.cancel_turn(turn.turn_id, "not needed", "ops") == "cancelled"

    assert s.turn_state(turn.turn_id) is TurnState.CANCELLED
    assert s.status == "idle"
    events = s.collect_events()
    assert state(replayed(s, events)) == state(s)
    with pytest.raises(errors.TurnFinished):
        s.cancel_turn(turn.turn_id, "again", "ops")


def test_a_running_turn_gets_a_request_its_owner_acts_on_at_the_boundary() -> None:
    s, tid, claim = running_with_call("echo", Effect.READ_ONLY)
    s.start_tool_call(tid, claim, "c1", "w1", Effect.READ_ONLY)

    assert s.cancel_turn(tid, "stop", "ops") == "requested"
    assert s.cancel_turn(tid, "stop", "ops") == "requested"  # a repeat records nothing more
    assert next_step(s, s.turn(tid), 8).action is Action.CANCEL
    s.finish_cancel(tid, T0, claim)

    assert s.turn_state(tid) is TurnState.CANCELLED
    events = s.collect_events()
    assert [type(e).__name__ for e in events].count("CancelRequested") == 1
    assert replayed(s, events).finished == s.finished
    # The turn's own events, replayed in full: the stopped call is cancelled with it.
    record = replay_turns(s.id, events)
    assert record.call("c1").state is CallState.CANCELLED
    assert record.turn(tid).reason == "stop"


def test_a_side_effecting_call_in_flight_keeps_the_turn_from_stopping() -> None:
    s, tid, claim = running_with_call()
    s.start_tool_call(tid, claim, "c1", "w1", Effect.SIDE_EFFECTING)
    s.cancel_turn(tid, "stop", "ops")

    with pytest.raises(errors.InvalidTransition):
        s.finish_cancel(tid, T0, claim)
    assert next_step(s, s.turn(tid), 8).action is Action.INTERRUPT  # owner gone: unknown
    s.record_tool_succeeded(tid, claim, "c1", 1, {"ok": True})
    assert next_step(s, s.turn(tid), 8).action is Action.CANCEL


def test_a_deadline_is_due_only_once_passed() -> None:
    s, tid, claim = running_with_call()
    turn = s.turn(tid)

    assert next_step(s, turn, 8, now=T0).action is not Action.CANCEL
    assert next_step(s, turn, 8, now=T0 + timedelta(seconds=61)).action is Action.CANCEL
    with pytest.raises(errors.InvalidTransition):
        s.finish_cancel(tid, T0, claim)
    s.finish_cancel(tid, T0 + timedelta(seconds=61), claim)
    assert s.finished[-1][1] == "cancelled"
    record = replay_turns(s.id, s.collect_events())
    assert (record.turn(tid).reason, record.turn(tid).actor) == ("deadline", "turnlog")
    assert record.call("c1").state is CallState.CANCELLED  # never started


@pytest.mark.parametrize("seconds", [0, -1, 1e9, float("nan"), float("inf"), True, "5"])
def test_a_bad_deadline_is_refused(seconds: Any) -> None:
    from turnlog.domain.session import check_deadline

    with pytest.raises(errors.InvalidDeadline):
        check_deadline(seconds)


def test_a_proposed_call_waits_then_runs_after_approval_with_edited_arguments() -> None:
    s, tid, claim = running_with_call()
    assert next_step(s, s.turn(tid), 8, needs_approval=lambda c: True).action is Action.PROPOSE

    s.propose_tool_call(tid, claim, "c1")
    assert s.turn(tid).state is TurnState.AWAITING_APPROVAL and s.status == "awaiting_approval"
    assert s.turn(tid).worker_id == ""
    s.approve_tool_call("c1", "ops", "fine", {"path": "a.txt", "text": "x"})

    call = s.call("c1")
    assert (call.state, call.approval, call.proposed_arguments) == (
        CallState.PENDING,
        "approved",
        {},
    )
    assert s.turn(tid).state is TurnState.RUNNING
    # Approved: not proposed again, whatever the rule says.
    assert next_step(s, s.turn(tid), 8, needs_approval=lambda c: True).action is Action.RUN_TOOL
    assert state(replayed(s, s.collect_events())) == state(s)


def test_a_rejected_call_is_answered_with_the_reason_and_never_runs() -> None:
    s, tid, claim = running_with_call()
    s.propose_tool_call(tid, claim, "c1")

    s.reject_tool_call("c1", "ops", "not this file")

    assert s.call("c1").state is CallState.REJECTED
    assert next_step(s, s.turn(tid), 8).action is Action.CALL_MODEL
    tool_messages = [m.content for m in next_request(s).messages if m.role == "tool"]
    assert tool_messages == ["rejected by operator: not this file"]
    with pytest.raises(errors.CallNotProposed):
        s.approve_tool_call("c1", "ops")


def test_follow_ups_queue_behind_the_current_turn_and_an_interrupted_one_refuses_them() -> None:
    s = Session.start()
    first, _ = s.submit_turn("one")
    with pytest.raises(errors.TurnInProgress):
        s.submit_turn("two")
    second, _ = s.submit_turn("two", enqueue=True)

    assert s.open_turn is first and s.queued_turns() == [second]
    with pytest.raises(errors.InvalidTransition):
        s.claim_turn(second.turn_id, "w1")  # not before the turn ahead of it
    claim = s.claim_turn(first.turn_id, "w1")
    assert [m.content for m in next_request(s).messages] == ["one"]  # the follow-up waits
    s.record_model_reply(
        first.turn_id, claim, "", [{"call_id": "c1", "name": "append_file", "arguments": {}}]
    )
    s.start_tool_call(first.turn_id, claim, "c1", "w1", Effect.SIDE_EFFECTING)
    s.interrupt_turn(first.turn_id, "w1")
    with pytest.raises(errors.UnresolvedTurn):
        s.submit_turn("three", enqueue=True)


def test_no_call_starts_once_the_turn_s_cancel_is_on_record() -> None:
    s, tid, claim = running_with_call()
    assert s.cancel_turn(tid, "stop", "ops") == "requested"

    with pytest.raises(errors.CancelPending):
        s.start_tool_call(tid, claim, "c1", "w1", Effect.SIDE_EFFECTING)
    assert s.call("c1").state is CallState.PENDING
