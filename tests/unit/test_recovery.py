"""Recovery decisions for open turns, from the stored state alone (docs/recovery.md)."""

from __future__ import annotations

from tests.unit.histories import (
    OPERATOR,
    WORKER,
    a_call,
    a_queued_turn,
    a_reply_with_calls,
    a_running_turn,
    a_session,
    a_started_call,
    an_interrupted_turn,
)
from turnlog.application.execution.recovery import summarize
from turnlog.domain.progress import Decision, Verdict, decide
from turnlog.domain.session import Session
from turnlog.domain.turns import MAX_TOOL_ATTEMPTS, Effect

MAX_STEPS = 8


def verdict_for(session: Session, turn_id: str, owner_alive: bool = False) -> Verdict:
    return decide(session, session.turn(turn_id), owner_alive, MAX_STEPS)


def a_turn_with_a_call_in_flight(session: Session, effect: Effect, name: str = "tool") -> str:
    turn_id = a_running_turn(session)
    a_reply_with_calls(session, turn_id, a_call("c1", name))
    a_started_call(session, turn_id, "c1", effect)
    return turn_id


def test_a_turn_whose_owner_holds_its_lease_is_left_alone() -> None:
    session = a_session()
    turn_id = a_turn_with_a_call_in_flight(session, Effect.SIDE_EFFECTING)

    verdict = verdict_for(session, turn_id, owner_alive=True)

    assert verdict.decision is Decision.LEAVE_OWNER_ALIVE
    assert verdict.detail == f"held by {WORKER}"


def test_an_interrupted_turn_is_left_for_an_operator_naming_its_unknown_calls() -> None:
    session = a_session()
    turn_id = an_interrupted_turn(session, "c1", "c2")

    verdict = verdict_for(session, turn_id)

    assert verdict.decision is Decision.LEAVE_FOR_OPERATOR
    assert verdict.detail == "unknown calls: c1, c2"
    assert verdict.state == "interrupted"


def test_a_queued_turn_is_started() -> None:
    session = a_session()
    turn_id = a_queued_turn(session)

    assert verdict_for(session, turn_id).decision is Decision.START


def test_a_running_turn_with_no_call_in_flight_is_resumed() -> None:
    session = a_session()
    turn_id = a_running_turn(session)
    a_reply_with_calls(session, turn_id, a_call("c1", "echo"))  # requested, never started

    verdict = verdict_for(session, turn_id)

    assert verdict.decision is Decision.RESUME
    assert verdict.call_id == ""


def test_a_safe_call_in_flight_is_run_again_with_the_next_attempt() -> None:
    session = a_session()
    turn_id = a_turn_with_a_call_in_flight(session, Effect.IDEMPOTENT, "sleep")

    verdict = verdict_for(session, turn_id)

    assert (verdict.decision, verdict.call_id, verdict.detail) == (
        Decision.RERUN,
        "c1",
        "sleep attempt 2",
    )


def test_a_safe_call_that_used_every_attempt_fails_the_turn() -> None:
    session = a_session()
    turn_id = a_turn_with_a_call_in_flight(session, Effect.READ_ONLY)
    for _ in range(MAX_TOOL_ATTEMPTS - 1):
        a_started_call(session, turn_id, "c1", Effect.READ_ONLY)

    verdict = verdict_for(session, turn_id)

    assert (verdict.decision, verdict.call_id) == (Decision.FAIL, "c1")
    assert "did not report" in verdict.detail


def test_a_side_effecting_call_in_flight_interrupts_the_turn() -> None:
    session = a_session()
    turn_id = a_turn_with_a_call_in_flight(session, Effect.SIDE_EFFECTING, "append_file")

    verdict = verdict_for(session, turn_id)

    assert (verdict.decision, verdict.call_id, verdict.detail) == (
        Decision.INTERRUPT,
        "c1",
        "append_file (side_effecting) was in flight",
    )


def test_a_turn_resumed_by_an_operator_is_resumed_by_recovery() -> None:
    session = a_session()
    turn_id = an_interrupted_turn(session, "c1")
    session.resolve_tool_call("c1", "succeeded", None, "checked", OPERATOR)

    assert verdict_for(session, turn_id).decision is Decision.RESUME


def test_a_verdict_names_its_session_turn_and_state() -> None:
    session = a_session()
    turn_id = a_queued_turn(session)

    assert verdict_for(session, turn_id).as_dict() == {
        "session_id": str(session.id),
        "turn_id": turn_id,
        "state": "queued",
        "decision": "start",
        "call_id": "",
        "detail": "",
    }


def _verdict(decision: Decision) -> Verdict:
    return Verdict("s", "t", "running", decision)


def test_a_summary_of_no_open_turns() -> None:
    assert summarize([]) == "0 open turns"


def test_a_summary_of_one_open_turn_is_singular() -> None:
    assert summarize([_verdict(Decision.START)]) == "1 open turn: 1 to start"


def test_a_summary_counts_each_decision_in_order_of_first_appearance() -> None:
    verdicts = [
        _verdict(Decision.RESUME),
        _verdict(Decision.RERUN),
        _verdict(Decision.RESUME),
        _verdict(Decision.INTERRUPT),
        _verdict(Decision.FAIL),
        _verdict(Decision.LEAVE_OWNER_ALIVE),
        _verdict(Decision.LEAVE_FOR_OPERATOR),
    ]

    assert summarize(verdicts) == (
        "7 open turns: 2 to resume, 1 to re-run, 1 to interrupt, 1 to fail, "
        "1 left to a live owner, 1 waiting for an operator"
    )
    assert summarize(verdicts, done=True) == (
        "7 open turns: 2 resumed, 1 re-run, 1 interrupted, 1 failed, "
        "1 left to a live owner, 1 waiting for an operator"
    )
