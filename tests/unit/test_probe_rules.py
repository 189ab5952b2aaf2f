"""The domain's rules for outcome probes: recorded, fenced, settling only what they prove."""

from __future__ import annotations

import pytest

from tests.unit.histories import (
    WORKER,
    a_call,
    a_reply_with_calls,
    a_running_turn,
    a_session,
    event_names,
    recorded,
)
from turnlog.domain import errors
from turnlog.domain.events import NOT_APPLIED_ERROR
from turnlog.domain.progress import Action, Decision, decide, next_step
from turnlog.domain.request import tool_result_text
from turnlog.domain.session import Session
from turnlog.domain.turns import MAX_TOOL_ATTEMPTS, CallState, Effect, ProbeAnswer, TurnState

RECOVERER = "worker-b"
PRE = {"path": "out.txt", "exists": True, "size": 4, "inode": 7, "device": 1}
OWNER = {"pid": 10, "process_started_at": 5, "host": "h", "boot_id": "b", "attempt": 0}


def a_call_in_flight(session: Session) -> str:
    """A side-effecting call started with a pre-state; its owner died; recovery claimed the turn."""
    turn_id = a_running_turn(session)
    a_reply_with_calls(session, turn_id, a_call("c1", text="x"))
    turn = session.turn(turn_id)
    session.start_tool_call(
        turn_id, turn.claim, "c1", WORKER, Effect.SIDE_EFFECTING, dict(PRE), dict(OWNER)
    )
    session.claim_turn(turn_id, RECOVERER)
    session.collect_events()
    return turn_id


def probe(session: Session, turn_id: str, answer: ProbeAnswer, note: str = "") -> None:
    claim = session.turn(turn_id).claim
    session.record_probe(turn_id, claim, "c1", answer, {"size": 4}, note, 0.01, RECOVERER)


def test_the_intent_records_the_pre_state_and_the_owner_process() -> None:
    session = a_session()
    a_call_in_flight(session)
    call = session.call("c1")
    assert call.pre_state == PRE and call.owner == OWNER


def test_an_applied_probe_resolves_the_call_as_succeeded_by_the_probe_with_its_evidence() -> None:
    session = a_session()
    turn_id = a_call_in_flight(session)
    probe(session, turn_id, ProbeAnswer.APPLIED, "the line is there")
    session.resolve_by_probe(turn_id, session.turn(turn_id).claim, "c1", {"bytes": 2})

    assert event_names(recorded(session)) == ["ToolCallProbed", "ToolCallResolved"]
    call = session.call("c1")
    assert call.state is CallState.RESOLVED and call.outcome == "succeeded"
    assert call.actor == "probe:append_file" and call.result == {"bytes": 2}
    assert call.evidence == {"size": 4}
    assert call.probes[0]["answer"] == "applied" and call.probes[0]["attempt"] == 1
    assert session.turn(turn_id).state is TurnState.RUNNING  # the turn goes on
    assert "established by the tool's probe" in tool_result_text(call)


def test_a_not_applied_probe_fails_the_call_and_tells_the_model() -> None:
    session = a_session()
    turn_id = a_call_in_flight(session)
    probe(session, turn_id, ProbeAnswer.NOT_APPLIED)
    session.resolve_by_probe(turn_id, session.turn(turn_id).claim, "c1")

    call = session.call("c1")
    assert call.outcome == "failed" and call.result == NOT_APPLIED_ERROR
    assert tool_result_text(call).startswith('error: "not applied (probe)"')


def test_a_not_applied_call_may_run_again_as_the_next_attempt() -> None:
    session = a_session()
    turn_id = a_call_in_flight(session)
    probe(session, turn_id, ProbeAnswer.NOT_APPLIED)
    turn = session.turn(turn_id)

    assert next_step(session, turn, 8).action is Action.RERUN_TOOL
    attempt = session.start_tool_call(turn_id, turn.claim, "c1", RECOVERER, Effect.SIDE_EFFECTING)
    assert attempt == 2
    # The new attempt has no probe answer: killed again, it is unknown again.
    assert session.call("c1").last_probe is None
    assert next_step(session, turn, 8).action is Action.INTERRUPT


def test_an_unknown_answer_settles_nothing_and_cannot_resolve() -> None:
    session = a_session()
    turn_id = a_call_in_flight(session)
    probe(session, turn_id, ProbeAnswer.UNKNOWN, "timed out")
    claim = session.turn(turn_id).claim

    with pytest.raises(errors.InvalidTransition):
        session.resolve_by_probe(turn_id, claim, "c1", {"x": 1})
    with pytest.raises(errors.InvalidTransition):
        session.start_tool_call(turn_id, claim, "c1", RECOVERER, Effect.SIDE_EFFECTING)
    session.interrupt_turn(turn_id, WORKER, RECOVERER)
    assert session.call("c1").state is CallState.UNKNOWN
    assert session.call("c1").probes[0]["note"] == "timed out"


def test_a_resolution_without_any_probe_is_refused() -> None:
    session = a_session()
    turn_id = a_call_in_flight(session)
    with pytest.raises(errors.InvalidTransition):
        session.resolve_by_probe(turn_id, session.turn(turn_id).claim, "c1", {})


def test_a_probe_is_recorded_only_under_the_current_claim() -> None:
    session = a_session()
    turn_id = a_call_in_flight(session)
    stale = session.turn(turn_id).claim - 1
    with pytest.raises(errors.StaleClaim):
        session.record_probe(turn_id, stale, "c1", ProbeAnswer.APPLIED, {}, "", 0.1, WORKER)
    with pytest.raises(errors.InvalidInput):
        probe(session, turn_id, "maybe")  # type: ignore[arg-type]


def test_a_not_applied_call_with_no_attempts_left_lets_the_turn_fail() -> None:
    session = a_session()
    turn_id = a_call_in_flight(session)
    for _ in range(MAX_TOOL_ATTEMPTS - 1):
        probe(session, turn_id, ProbeAnswer.NOT_APPLIED)
        turn = session.turn(turn_id)
        session.start_tool_call(turn_id, turn.claim, "c1", RECOVERER, Effect.SIDE_EFFECTING)
    probe(session, turn_id, ProbeAnswer.NOT_APPLIED)
    turn = session.turn(turn_id)
    step = next_step(session, turn, 8)
    assert step.action is Action.FAIL
    session.fail_turn(turn_id, turn.claim, step.reason)
    assert session.turn(turn_id).state is TurnState.FAILED


def test_recovery_decides_to_probe_only_tools_that_have_a_probe() -> None:
    session = a_session()
    turn_id = a_call_in_flight(session)
    turn = session.turn(turn_id)
    assert decide(session, turn, False, 8).decision is Decision.INTERRUPT
    assert decide(session, turn, False, 8, {"append_file"}).decision is Decision.PROBE
    assert decide(session, turn, True, 8, {"append_file"}).decision is Decision.LEAVE_OWNER_ALIVE


def test_stored_intents_without_the_new_fields_still_load() -> None:
    event = Session.ToolCallStarted(  # type: ignore[call-arg]
        originator_id=a_session().id,
        originator_version=1,
        timestamp=Session.ToolCallStarted.create_timestamp(),
        turn_id="t",
        call_id="c",
        attempt=1,
        worker_id="w",
        claim=1,
        effect="side_effecting",
    )
    assert event.pre_state is None and event.owner is None


def test_the_unresolved_turn_refusal_carries_the_note_of_a_probe_that_answered_unknown() -> None:
    session = a_session()
    turn_id = a_call_in_flight(session)
    probe(session, turn_id, ProbeAnswer.UNKNOWN, "another file is in its place (inode changed)")
    session.interrupt_turn(turn_id, WORKER, RECOVERER)

    with pytest.raises(errors.UnresolvedTurn) as refused:
        session.submit_turn("next")

    [call] = refused.value.unknown_calls
    assert call["probe"] == {
        "answer": "unknown",
        "note": "another file is in its place (inode changed)",
    }
    assert refused.value.extra["unknown_calls"][0]["probe"]["answer"] == "unknown"


def test_the_unresolved_turn_refusal_names_no_probe_when_none_ran() -> None:
    session = a_session()
    turn_id = a_call_in_flight(session)
    session.interrupt_turn(turn_id, WORKER, RECOVERER)

    with pytest.raises(errors.UnresolvedTurn) as refused:
        session.submit_turn("next")

    assert "probe" not in refused.value.unknown_calls[0]
