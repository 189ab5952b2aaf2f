"""The Session aggregate: given events, a command, then the events it records or its refusal."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from eventsourcing.utils import get_topic, resolve_topic

from tests.unit.histories import (
    OPERATOR,
    OTHER_WORKER,
    WORKER,
    a_call,
    a_completed_turn,
    a_failed_turn,
    a_queued_turn,
    a_reply_with_calls,
    a_running_turn,
    a_session,
    a_started_call,
    an_abandoned_turn,
    an_interrupted_turn,
    event_names,
    recorded,
    refuse,
)
from turnlog.domain import errors
from turnlog.domain.session import Session
from turnlog.domain.turns import MAX_MESSAGE_BYTES, MAX_TOOL_ATTEMPTS, CallState, Effect, TurnState

# ------------------------------------------------------------------ starting


def test_starting_a_session_records_its_settings() -> None:
    session = Session.start(
        title="demo",
        system_prompt="Be brief.",
        provider="fixture",
        model="m1",
        tools=["echo"],
        metadata={"team": "a"},
        created_by="alice",
    )

    [started] = recorded(session)
    assert type(started) is Session.Started
    assert (started.title, started.system_prompt, started.provider, started.model) == (
        "demo",
        "Be brief.",
        "fixture",
        "m1",
    )
    assert (started.tools, started.metadata, started.created_by) == (
        ["echo"],
        {"team": "a"},
        "alice",
    )
    assert session.status == "idle"
    assert session.turns == []


def test_every_stored_class_has_an_explicit_versioned_topic() -> None:
    classes = [
        value
        for value in vars(Session).values()
        if isinstance(value, type)
        and issubclass(value, Session.Event | Session.Created | Session.Snapshot)
        and value is not Session.Event  # an abstract base: never recorded
    ]
    topics = [get_topic(cls) for cls in classes]

    assert {c.__name__ for c in classes} >= {
        "Started",
        "TurnSubmitted",
        "TurnClaimed",
        "ModelReplied",
        "ToolCallStarted",
        "ToolCallSucceeded",
        "ToolCallFailed",
        "TurnCompleted",
        "TurnFailed",
        "TurnInterrupted",
        "ToolCallResolved",
        "TurnAbandoned",
        "Closed",
        "Snapshot",
    }
    assert len(set(topics)) == len(topics)
    for cls, topic in zip(classes, topics, strict=True):
        assert re.fullmatch(r"turnlog\.session\.\w+\.v\d+", topic), cls
        assert resolve_topic(topic) is cls


# ------------------------------------------------------------------ submitting


def test_a_submitted_turn_is_queued_with_its_message() -> None:
    session = a_session()

    turn, created = session.submit_turn("hello", "key-1")

    [submitted] = recorded(session)
    assert type(submitted) is Session.TurnSubmitted
    assert (submitted.turn_id, submitted.message, submitted.idempotency_key) == (
        turn.turn_id,
        "hello",
        "key-1",
    )
    assert created is True
    assert turn.state is TurnState.QUEUED
    assert session.status == "busy"


def test_refuses_a_new_turn_while_the_last_one_is_queued() -> None:
    session = a_session()
    turn_id = a_queued_turn(session)

    error = refuse(session, lambda: session.submit_turn("again"), errors.TurnInProgress)

    assert error.code == "turn_in_progress"
    assert error.extra["turn_id"] == turn_id


def test_refuses_a_new_turn_while_the_last_one_is_running() -> None:
    session = a_session()
    a_running_turn(session)

    refuse(session, lambda: session.submit_turn("again"), errors.TurnInProgress, "turn_in_progress")


def test_refuses_a_new_turn_while_a_tool_call_outcome_is_unknown() -> None:
    session = a_session()
    turn_id = a_running_turn(session, "write it")
    a_reply_with_calls(session, turn_id, a_call("c1", path="notes.txt", text="x"))
    session.start_tool_call(turn_id, 1, "c1", WORKER, Effect.SIDE_EFFECTING)
    [started] = recorded(session)
    session.interrupt_turn(turn_id, previous_worker=WORKER)
    recorded(session)

    error = refuse(session, lambda: session.submit_turn("again"), errors.UnresolvedTurn)

    assert isinstance(error, errors.UnresolvedTurn)
    assert error.code == "unresolved_turn"
    assert error.turn_id == turn_id
    assert error.unknown_calls == [
        {
            "call_id": "c1",
            "name": "append_file",
            "arguments": {"path": "notes.txt", "text": "x"},
            "attempt": 1,
            "worker_id": WORKER,
            "started_at": started.timestamp.isoformat(),
        }
    ]
    assert "c1 (append_file)" in error.detail


@pytest.mark.parametrize("finish", [a_completed_turn, a_failed_turn, an_abandoned_turn])
def test_completed_failed_and_abandoned_turns_do_not_block_a_new_turn(finish: Any) -> None:
    session = a_session()
    finish(session)

    turn, created = session.submit_turn("next")

    assert created is True
    assert event_names(recorded(session)) == ["TurnSubmitted"]
    assert session.open_turn is turn


def test_a_repeated_idempotency_key_returns_the_existing_turn_and_records_nothing() -> None:
    session = a_session()
    turn_id = a_queued_turn(session, "hello", key="k1")
    session.claim_turn(turn_id, WORKER)
    recorded(session)
    version = session.version

    turn, created = session.submit_turn("hello", "k1")

    assert (turn.turn_id, created) == (turn_id, False)
    assert recorded(session) == []
    assert session.version == version


def test_a_repeated_idempotency_key_returns_its_turn_even_after_the_session_moved_on() -> None:
    session = a_session()
    first = a_queued_turn(session, "hello", key="k1")
    session.claim_turn(first, WORKER)
    session.complete_turn(first, 1, "hi")
    a_queued_turn(session, "second")

    turn, created = session.submit_turn("hello", "k1")

    assert (turn.turn_id, created) == (first, False)
    assert turn.state is TurnState.COMPLETED
    assert recorded(session) == []


def test_refuses_an_idempotency_key_reused_for_a_different_message() -> None:
    session = a_session()
    a_completed_turn(session)
    a_queued_turn(session, "hello", key="k1")

    refuse(
        session,
        lambda: session.submit_turn("something else", "k1"),
        errors.IdempotencyKeyReused,
        "idempotency_key_reused",
    )


def test_idempotency_keys_belong_to_one_session() -> None:
    first, second = a_session(), a_session()
    a_queued_turn(first, "hello", key="k1")

    _, created = second.submit_turn("hello", "k1")

    assert created is True


def test_turns_without_an_idempotency_key_are_never_deduplicated() -> None:
    session = a_session()
    a_completed_turn(session, "hello")

    _, created = session.submit_turn("hello")

    assert created is True
    assert len(session.turns) == 2


@pytest.mark.parametrize("message", ["", "   ", "\n\t "])
def test_refuses_an_empty_message(message: str) -> None:
    session = a_session()

    refuse(session, lambda: session.submit_turn(message), errors.InvalidMessage, "invalid_message")


def test_refuses_a_message_larger_than_64_kib_counted_in_utf8_bytes() -> None:
    session = a_session()
    message = "é" * (MAX_MESSAGE_BYTES // 2 + 1)  # fewer characters than the limit, more bytes

    assert len(message) < MAX_MESSAGE_BYTES
    refuse(session, lambda: session.submit_turn(message), errors.InvalidMessage, "invalid_message")


def test_accepts_a_message_of_exactly_64_kib() -> None:
    session = a_session()

    _, created = session.submit_turn("x" * MAX_MESSAGE_BYTES)

    assert created is True
    assert event_names(recorded(session)) == ["TurnSubmitted"]


def test_a_closed_session_refuses_new_turns() -> None:
    session = a_session()
    session.close(reason="done", actor=OPERATOR)
    recorded(session)

    refuse(session, lambda: session.submit_turn("hello"), errors.SessionClosed, "session_closed")


# ------------------------------------------------------------------ claiming


def test_claiming_a_queued_turn_makes_it_running_under_claim_one() -> None:
    session = a_session()
    turn_id = a_queued_turn(session)

    claim = session.claim_turn(turn_id, WORKER)

    [claimed] = recorded(session)
    assert type(claimed) is Session.TurnClaimed
    assert (claimed.turn_id, claimed.worker_id, claimed.claim) == (turn_id, WORKER, 1)
    assert claim == 1
    turn = session.turn(turn_id)
    assert (turn.state, turn.worker_id, turn.claim) == (TurnState.RUNNING, WORKER, 1)


def test_a_new_owner_takes_over_a_running_turn_with_the_next_claim() -> None:
    session = a_session()
    turn_id = a_running_turn(session, worker=WORKER)

    claim = session.claim_turn(turn_id, OTHER_WORKER)

    [claimed] = recorded(session)
    assert (claimed.claim, claimed.worker_id, claim) == (2, OTHER_WORKER, 2)
    assert session.turn(turn_id).worker_id == OTHER_WORKER


@pytest.mark.parametrize(
    "finish", [a_completed_turn, a_failed_turn, an_interrupted_turn, an_abandoned_turn]
)
def test_refuses_to_claim_a_turn_that_is_not_queued_or_running(finish: Any) -> None:
    session = a_session()
    turn_id = finish(session)

    refuse(session, lambda: session.claim_turn(turn_id, OTHER_WORKER), errors.InvalidTransition)


def test_claiming_a_turn_the_session_does_not_have_is_not_found() -> None:
    session = a_session()

    refuse(session, lambda: session.claim_turn("nope", WORKER), errors.TurnNotFound)


# ------------------------------------------------------------------ fencing


def _stale_steps(session: Session, turn_id: str) -> dict[str, Any]:
    """Every step a worker records, made under claim 1."""
    return {
        "model reply": lambda: session.record_model_reply(turn_id, 1, "hi", []),
        "tool start": lambda: session.start_tool_call(turn_id, 1, "c2", WORKER, Effect.READ_ONLY),
        "tool success": lambda: session.record_tool_succeeded(turn_id, 1, "c1", 1, {}),
        "tool failure": lambda: session.record_tool_failed(turn_id, 1, "c1", 1, "boom"),
        "completion": lambda: session.complete_turn(turn_id, 1, "hi"),
        "failure": lambda: session.fail_turn(turn_id, 1, "boom"),
    }


@pytest.mark.parametrize(
    "step", ["model reply", "tool start", "tool success", "tool failure", "completion", "failure"]
)
def test_only_the_current_claim_may_record_steps_of_a_turn(step: str) -> None:
    session = a_session()
    turn_id = a_running_turn(session, worker=WORKER)
    a_reply_with_calls(session, turn_id, a_call("c1", "echo"), a_call("c2", "echo"))
    a_started_call(session, turn_id, "c1", Effect.READ_ONLY)
    session.claim_turn(turn_id, OTHER_WORKER)  # the first owner was presumed dead
    recorded(session)

    error = refuse(session, _stale_steps(session, turn_id)[step], errors.StaleClaim)

    assert error.code == "stale_claim"


def test_a_queued_turn_takes_no_steps_before_it_is_claimed() -> None:
    session = a_session()
    turn_id = a_queued_turn(session)

    refuse(
        session, lambda: session.record_model_reply(turn_id, 0, "hi", []), errors.InvalidTransition
    )


def test_an_interrupted_turn_takes_no_steps_from_its_former_owner() -> None:
    session = a_session()
    turn_id = an_interrupted_turn(session, "c1")

    refuse(session, lambda: session.complete_turn(turn_id, 1, "hi"), errors.InvalidTransition)


# ------------------------------------------------------------------ model replies


def test_a_model_reply_records_its_step_and_tool_calls_as_pending() -> None:
    session = a_session()
    turn_id = a_running_turn(session)

    step = session.record_model_reply(
        turn_id, 1, "let me check", [a_call("c1", "echo", text="x")], {"tokens": 3}
    )

    [replied] = recorded(session)
    assert type(replied) is Session.ModelReplied
    assert (replied.turn_id, replied.step, replied.text, replied.usage) == (
        turn_id,
        1,
        "let me check",
        {"tokens": 3},
    )
    assert replied.tool_calls == [{"call_id": "c1", "name": "echo", "arguments": {"text": "x"}}]
    assert (step.step, step.call_ids) == (1, ["c1"])
    call = session.call("c1")
    assert (call.state, call.turn_id, call.step) == (CallState.PENDING, turn_id, 1)


def test_refuses_a_tool_call_id_already_used_in_an_earlier_turn() -> None:
    session = a_session()
    first = a_running_turn(session)
    a_reply_with_calls(session, first, a_call("c1", "echo"))
    session.fail_turn(first, 1, "step limit")
    second = a_running_turn(session)

    refuse(
        session,
        lambda: session.record_model_reply(second, 1, "", [a_call("c1", "echo")]),
        errors.DuplicateToolCall,
        "duplicate_tool_call",
    )


def test_refuses_a_tool_call_id_repeated_within_one_reply() -> None:
    session = a_session()
    turn_id = a_running_turn(session)

    refuse(
        session,
        lambda: session.record_model_reply(turn_id, 1, "", [a_call("c1"), a_call("c1")]),
        errors.DuplicateToolCall,
    )


def test_refuses_a_tool_call_without_an_id() -> None:
    session = a_session()
    turn_id = a_running_turn(session)

    refuse(
        session,
        lambda: session.record_model_reply(turn_id, 1, "", [a_call("")]),
        errors.DuplicateToolCall,
    )


def test_refuses_tool_call_arguments_that_are_not_an_object() -> None:
    session = a_session()
    turn_id = a_running_turn(session)
    call = {"call_id": "c1", "name": "echo", "arguments": ["x"]}

    refuse(session, lambda: session.record_model_reply(turn_id, 1, "", [call]), errors.InvalidInput)


def test_refuses_a_model_reply_while_the_previous_step_has_unsettled_calls() -> None:
    session = a_session()
    turn_id = a_running_turn(session)
    a_reply_with_calls(session, turn_id, a_call("c1", "echo"))

    refuse(
        session, lambda: session.record_model_reply(turn_id, 1, "hi", []), errors.InvalidTransition
    )


# ------------------------------------------------------------------ tool calls


def test_starting_a_tool_call_records_the_intent_before_it_runs() -> None:
    session = a_session()
    turn_id = a_running_turn(session)
    a_reply_with_calls(session, turn_id, a_call("c1", "echo"))

    attempt = session.start_tool_call(turn_id, 1, "c1", WORKER, Effect.READ_ONLY)

    [started] = recorded(session)
    assert type(started) is Session.ToolCallStarted
    assert (started.turn_id, started.call_id, started.attempt) == (turn_id, "c1", 1)
    assert (started.worker_id, started.claim, started.effect) == (WORKER, 1, "read_only")
    assert attempt == 1
    call = session.call("c1")
    assert (call.state, call.attempt, call.started_at) == (
        CallState.STARTED,
        1,
        started.timestamp,
    )


def test_a_tool_result_is_recorded_for_the_attempt_in_flight() -> None:
    session = a_session()
    turn_id = a_running_turn(session)
    a_reply_with_calls(session, turn_id, a_call("c1", "echo"), a_call("c2", "echo"))
    a_started_call(session, turn_id, "c1", Effect.READ_ONLY)
    a_started_call(session, turn_id, "c2", Effect.READ_ONLY)

    session.record_tool_succeeded(turn_id, 1, "c1", 1, {"text": "x"})
    session.record_tool_failed(turn_id, 1, "c2", 1, "boom")

    succeeded, failed = recorded(session)
    assert type(succeeded) is Session.ToolCallSucceeded
    assert (succeeded.call_id, succeeded.attempt, succeeded.result) == ("c1", 1, {"text": "x"})
    assert type(failed) is Session.ToolCallFailed
    assert (failed.call_id, failed.attempt, failed.error) == ("c2", 1, "boom")
    assert (session.call("c1").state, session.call("c1").result) == (
        CallState.SUCCEEDED,
        {"text": "x"},
    )
    assert (session.call("c2").state, session.call("c2").error) == (CallState.FAILED, "boom")


def test_refuses_a_tool_result_before_its_tool_call_started() -> None:
    session = a_session()
    turn_id = a_running_turn(session)
    a_reply_with_calls(session, turn_id, a_call("c1", "echo"))

    refuse(
        session,
        lambda: session.record_tool_succeeded(turn_id, 1, "c1", 1, {}),
        errors.InvalidTransition,
    )


def test_refuses_a_tool_result_for_an_attempt_that_is_not_in_flight() -> None:
    session = a_session()
    turn_id = a_running_turn(session)
    a_reply_with_calls(session, turn_id, a_call("c1", "echo"))
    a_started_call(session, turn_id, "c1", Effect.READ_ONLY)
    a_started_call(session, turn_id, "c1", Effect.READ_ONLY)  # attempt 2 replaced attempt 1

    refuse(
        session,
        lambda: session.record_tool_succeeded(turn_id, 1, "c1", 1, {}),
        errors.InvalidTransition,
    )
    refuse(
        session,
        lambda: session.record_tool_failed(turn_id, 1, "c1", 3, "boom"),
        errors.InvalidTransition,
    )


def test_a_new_owner_cannot_record_a_result_for_an_attempt_its_predecessor_started() -> None:
    session = a_session()
    turn_id = a_running_turn(session)
    a_reply_with_calls(session, turn_id, a_call("c1", "echo"))
    a_started_call(session, turn_id, "c1", Effect.READ_ONLY)  # attempt 1 under claim 1
    session.claim_turn(turn_id, OTHER_WORKER)  # recovery: claim 2
    session.collect_events()

    refuse(
        session,
        lambda: session.record_tool_succeeded(turn_id, 2, "c1", 1, {"late": True}),
        errors.InvalidTransition,
    )


def test_a_re_run_keeps_the_effect_class_the_call_first_ran_under() -> None:
    session = a_session()
    turn_id = a_running_turn(session)
    a_reply_with_calls(session, turn_id, a_call("c1", "echo"))
    a_started_call(session, turn_id, "c1", Effect.READ_ONLY)
    session.start_tool_call(turn_id, 1, "c1", WORKER, Effect.SIDE_EFFECTING)
    assert session.call("c1").effect == "read_only"
    assert session.call("c1").attempt == 2


def test_refuses_an_unknown_effect_class() -> None:
    session = a_session()
    turn_id = a_running_turn(session)
    a_reply_with_calls(session, turn_id, a_call("c1", "echo"))
    refuse(
        session,
        lambda: session.start_tool_call(turn_id, 1, "c1", WORKER, "reckless"),  # type: ignore[arg-type]
        errors.InvalidInput,
    )


def test_refuses_a_second_result_for_the_same_attempt() -> None:
    session = a_session()
    turn_id = a_running_turn(session)
    a_reply_with_calls(session, turn_id, a_call("c1", "echo"))
    a_started_call(session, turn_id, "c1", Effect.READ_ONLY)
    session.record_tool_succeeded(turn_id, 1, "c1", 1, {})
    recorded(session)

    refuse(
        session,
        lambda: session.record_tool_failed(turn_id, 1, "c1", 1, "late"),
        errors.InvalidTransition,
    )


def test_refuses_to_touch_a_tool_call_of_another_turn() -> None:
    session = a_session()
    first = a_running_turn(session)
    a_reply_with_calls(session, first, a_call("c1", "echo"))
    a_started_call(session, first, "c1", Effect.READ_ONLY)
    session.fail_turn(first, 1, "gave up")
    second = a_running_turn(session)

    refuse(
        session,
        lambda: session.record_tool_succeeded(second, 1, "c1", 1, {}),
        errors.ToolCallNotFound,
    )
    refuse(
        session,
        lambda: session.start_tool_call(second, 1, "c1", WORKER, Effect.READ_ONLY),
        errors.ToolCallNotFound,
    )


def test_a_result_for_a_call_the_session_does_not_have_is_not_found() -> None:
    session = a_session()
    turn_id = a_running_turn(session)

    refuse(
        session,
        lambda: session.record_tool_succeeded(turn_id, 1, "nope", 1, {}),
        errors.ToolCallNotFound,
        "tool_call_not_found",
    )


@pytest.mark.parametrize("effect", [Effect.READ_ONLY, Effect.IDEMPOTENT])
def test_a_started_safe_call_runs_again_up_to_the_attempt_limit(effect: Effect) -> None:
    session = a_session()
    turn_id = a_running_turn(session)
    a_reply_with_calls(session, turn_id, a_call("c1", "echo"))

    attempts = [
        session.start_tool_call(turn_id, 1, "c1", WORKER, effect) for _ in range(MAX_TOOL_ATTEMPTS)
    ]

    assert attempts == list(range(1, MAX_TOOL_ATTEMPTS + 1))
    assert [e.attempt for e in recorded(session)] == attempts
    refuse(
        session,
        lambda: session.start_tool_call(turn_id, 1, "c1", WORKER, effect),
        errors.InvalidTransition,
    )


def test_a_new_owner_runs_a_started_safe_call_again_under_its_own_claim() -> None:
    session = a_session()
    turn_id = a_running_turn(session, worker=WORKER)
    a_reply_with_calls(session, turn_id, a_call("c1", "echo"))
    a_started_call(session, turn_id, "c1", Effect.READ_ONLY)
    session.claim_turn(turn_id, OTHER_WORKER)
    recorded(session)

    attempt = session.start_tool_call(turn_id, 2, "c1", OTHER_WORKER, Effect.READ_ONLY)

    [started] = recorded(session)
    assert (attempt, started.attempt, started.claim, started.worker_id) == (2, 2, 2, OTHER_WORKER)


def test_refuses_to_run_a_started_side_effecting_call_again() -> None:
    session = a_session()
    turn_id = a_running_turn(session)
    a_reply_with_calls(session, turn_id, a_call("c1"))
    a_started_call(session, turn_id, "c1", Effect.SIDE_EFFECTING)

    refuse(
        session,
        lambda: session.start_tool_call(turn_id, 1, "c1", WORKER, Effect.SIDE_EFFECTING),
        errors.InvalidTransition,
    )


def test_refuses_to_start_a_call_whose_outcome_is_recorded() -> None:
    session = a_session()
    turn_id = a_running_turn(session)
    a_reply_with_calls(session, turn_id, a_call("c1", "echo"))
    a_started_call(session, turn_id, "c1", Effect.READ_ONLY)
    session.record_tool_succeeded(turn_id, 1, "c1", 1, {})
    recorded(session)

    refuse(
        session,
        lambda: session.start_tool_call(turn_id, 1, "c1", WORKER, Effect.READ_ONLY),
        errors.InvalidTransition,
    )


# ------------------------------------------------------------------ completing and failing


def test_completing_a_turn_records_its_reply_and_frees_the_session() -> None:
    session = a_session()
    turn_id = a_running_turn(session)
    session.record_model_reply(turn_id, 1, "hi there", [])
    recorded(session)

    session.complete_turn(turn_id, 1, "hi there")

    [completed] = recorded(session)
    assert type(completed) is Session.TurnCompleted
    assert (completed.turn_id, completed.reply) == (turn_id, "hi there")
    turn = session.turn(turn_id)
    assert (turn.state, turn.reply, turn.state_since) == (
        TurnState.COMPLETED,
        "hi there",
        completed.timestamp,
    )
    assert session.status == "idle"


def test_refuses_to_complete_a_turn_with_unsettled_tool_calls() -> None:
    session = a_session()
    turn_id = a_running_turn(session)
    a_reply_with_calls(session, turn_id, a_call("c1", "echo"))

    refuse(session, lambda: session.complete_turn(turn_id, 1, "hi"), errors.InvalidTransition)


def test_failing_a_turn_settles_the_calls_it_left_behind() -> None:
    session = a_session()
    turn_id = a_running_turn(session)
    a_reply_with_calls(session, turn_id, a_call("c1", "echo"), a_call("c2", "echo"))
    a_started_call(session, turn_id, "c1", Effect.READ_ONLY)

    session.fail_turn(turn_id, 1, "tool gave no answer")

    [failed] = recorded(session)
    assert type(failed) is Session.TurnFailed
    assert (failed.turn_id, failed.error) == (turn_id, "tool gave no answer")
    assert session.turn(turn_id).state is TurnState.FAILED
    assert session.call("c1").state is CallState.FAILED
    assert session.call("c1").error == "turn failed: tool gave no answer"
    assert session.call("c2").state is CallState.FAILED
    assert session.call("c2").error == "not run: turn failed: tool gave no answer"


def test_refuses_to_fail_a_turn_with_a_side_effecting_call_in_flight() -> None:
    session = a_session()
    turn_id = a_running_turn(session)
    a_reply_with_calls(session, turn_id, a_call("c1"))
    a_started_call(session, turn_id, "c1", Effect.SIDE_EFFECTING)

    refuse(session, lambda: session.fail_turn(turn_id, 1, "boom"), errors.InvalidTransition)


# ------------------------------------------------------------------ interrupting


def test_interrupting_makes_the_unsafe_call_in_flight_unknown_and_blocks_the_session() -> None:
    session = a_session()
    turn_id = a_running_turn(session)
    a_reply_with_calls(session, turn_id, a_call("c1"), a_call("c2", "echo"))
    a_started_call(session, turn_id, "c1", Effect.SIDE_EFFECTING)

    unknown = session.interrupt_turn(turn_id, previous_worker=WORKER)

    [interrupted] = recorded(session)
    assert type(interrupted) is Session.TurnInterrupted
    assert (interrupted.turn_id, interrupted.call_ids, interrupted.previous_worker) == (
        turn_id,
        ["c1"],
        WORKER,
    )
    assert unknown == ["c1"]
    turn = session.turn(turn_id)
    assert (turn.state, turn.worker_id, turn.previous_worker, turn.unknown_call_ids) == (
        TurnState.INTERRUPTED,
        "",
        WORKER,
        ["c1"],
    )
    assert session.call("c1").state is CallState.UNKNOWN
    assert session.call("c2").state is CallState.PENDING
    assert session.status == "blocked"


def _no_call(session: Session, turn_id: str) -> None:
    return None


def _a_pending_call(session: Session, turn_id: str) -> None:
    a_reply_with_calls(session, turn_id, a_call("c1"))


def _a_safe_call_in_flight(session: Session, turn_id: str) -> None:
    a_reply_with_calls(session, turn_id, a_call("c1", "echo"))
    a_started_call(session, turn_id, "c1", Effect.IDEMPOTENT)


def _a_finished_unsafe_call(session: Session, turn_id: str) -> None:
    a_reply_with_calls(session, turn_id, a_call("c1"))
    a_started_call(session, turn_id, "c1", Effect.SIDE_EFFECTING)
    session.record_tool_succeeded(turn_id, 1, "c1", 1, {})
    recorded(session)


@pytest.mark.parametrize(
    "given", [_no_call, _a_pending_call, _a_safe_call_in_flight, _a_finished_unsafe_call]
)
def test_refuses_to_interrupt_a_turn_without_an_unsafe_call_in_flight(given: Any) -> None:
    session = a_session()
    turn_id = a_running_turn(session)
    given(session, turn_id)

    refuse(session, lambda: session.interrupt_turn(turn_id, WORKER), errors.InvalidTransition)


@pytest.mark.parametrize("finish", [a_queued_turn, a_completed_turn, an_interrupted_turn])
def test_refuses_to_interrupt_a_turn_that_is_not_running(finish: Any) -> None:
    session = a_session()
    turn_id = finish(session)

    refuse(session, lambda: session.interrupt_turn(turn_id, WORKER), errors.InvalidTransition)


# ------------------------------------------------------------------ resolving


def test_resolving_the_last_unknown_call_returns_the_turn_to_running_without_an_owner() -> None:
    session = a_session()
    turn_id = an_interrupted_turn(session, "c1")

    turn = session.resolve_tool_call("c1", "succeeded", {"bytes": 3}, "file has the line", OPERATOR)

    [resolved] = recorded(session)
    assert type(resolved) is Session.ToolCallResolved
    assert (resolved.turn_id, resolved.call_id, resolved.outcome, resolved.result) == (
        turn_id,
        "c1",
        "succeeded",
        {"bytes": 3},
    )
    assert (resolved.note, resolved.actor) == ("file has the line", OPERATOR)
    call = session.call("c1")
    assert (call.state, call.outcome, call.result, call.note, call.actor) == (
        CallState.RESOLVED,
        "succeeded",
        {"bytes": 3},
        "file has the line",
        OPERATOR,
    )
    assert turn.turn_id == turn_id
    assert (turn.state, turn.worker_id, turn.unknown_call_ids) == (TurnState.RUNNING, "", [])
    assert session.status == "busy"


def test_a_turn_stays_interrupted_until_every_unknown_call_is_resolved() -> None:
    session = a_session()
    turn_id = an_interrupted_turn(session, "c1", "c2")

    session.resolve_tool_call("c1", "failed", "disk full", "saw the error", OPERATOR)

    assert event_names(recorded(session)) == ["ToolCallResolved"]
    assert session.turn(turn_id).state is TurnState.INTERRUPTED
    assert [c.call_id for c in session.unknown_calls(session.turn(turn_id))] == ["c2"]

    session.resolve_tool_call("c2", "succeeded", None, "line is there", OPERATOR)

    assert session.turn(turn_id).state is TurnState.RUNNING


def test_a_resumed_turn_is_claimed_afresh_and_its_former_claim_stays_stale() -> None:
    session = a_session()
    turn_id = an_interrupted_turn(session, "c1")
    session.resolve_tool_call("c1", "succeeded", None, "checked", OPERATOR)
    recorded(session)

    refuse(session, lambda: session.record_model_reply(turn_id, 1, "hi", []), errors.StaleClaim)
    claim = session.claim_turn(turn_id, OTHER_WORKER)

    assert claim == 2
    session.record_model_reply(turn_id, 2, "done", [])
    session.complete_turn(turn_id, 2, "done")
    assert session.turn(turn_id).state is TurnState.COMPLETED


@pytest.mark.parametrize("outcome", ["", "unknown", "SUCCEEDED", "abandoned"])
def test_refuses_to_resolve_with_an_outcome_other_than_succeeded_or_failed(outcome: str) -> None:
    session = a_session()
    an_interrupted_turn(session, "c1")

    refuse(
        session,
        lambda: session.resolve_tool_call("c1", outcome, None, "checked", OPERATOR),
        errors.InvalidOperatorAction,
        "invalid_operator_action",
    )


@pytest.mark.parametrize(
    ("note", "actor"), [("", OPERATOR), ("  ", OPERATOR), ("ok", ""), ("ok", " ")]
)
def test_refuses_to_resolve_without_a_note_and_an_actor(note: str, actor: str) -> None:
    session = a_session()
    an_interrupted_turn(session, "c1")

    refuse(
        session,
        lambda: session.resolve_tool_call("c1", "succeeded", None, note, actor),
        errors.InvalidOperatorAction,
    )


def _pending(session: Session) -> str:
    turn_id = a_running_turn(session)
    a_reply_with_calls(session, turn_id, a_call("c1"))
    return "c1"


def _succeeded(session: Session) -> str:
    turn_id = a_running_turn(session)
    a_reply_with_calls(session, turn_id, a_call("c1"))
    a_started_call(session, turn_id, "c1")
    session.record_tool_succeeded(turn_id, 1, "c1", 1, {})
    recorded(session)
    return "c1"


def _resolved(session: Session) -> str:
    an_interrupted_turn(session, "c1")
    session.resolve_tool_call("c1", "succeeded", None, "checked", OPERATOR)
    recorded(session)
    return "c1"


def _abandoned(session: Session) -> str:
    an_abandoned_turn(session)
    return "c1"


@pytest.mark.parametrize("given", [_pending, _succeeded, _resolved, _abandoned])
def test_refuses_to_resolve_a_call_whose_outcome_is_not_unknown(given: Any) -> None:
    session = a_session()
    call_id = given(session)

    refuse(
        session,
        lambda: session.resolve_tool_call(call_id, "succeeded", None, "checked", OPERATOR),
        errors.InvalidTransition,
    )


def test_resolving_a_call_the_session_does_not_have_is_not_found() -> None:
    session = a_session()
    an_interrupted_turn(session, "c1")

    refuse(
        session,
        lambda: session.resolve_tool_call("nope", "succeeded", None, "checked", OPERATOR),
        errors.ToolCallNotFound,
    )


# ------------------------------------------------------------------ abandoning


def test_abandoning_an_interrupted_turn_gives_up_its_unknown_calls() -> None:
    session = a_session()
    turn_id = an_interrupted_turn(session, "c1", "c2")

    given_up = session.abandon_turn(turn_id, reason="cannot tell", actor=OPERATOR)

    [abandoned] = recorded(session)
    assert type(abandoned) is Session.TurnAbandoned
    assert (abandoned.turn_id, abandoned.reason, abandoned.actor, abandoned.call_ids) == (
        turn_id,
        "cannot tell",
        OPERATOR,
        ["c1", "c2"],
    )
    assert given_up == ["c1", "c2"]
    turn = session.turn(turn_id)
    assert (turn.state, turn.reason, turn.actor) == (TurnState.ABANDONED, "cannot tell", OPERATOR)
    assert [session.call(c).state for c in ("c1", "c2")] == [CallState.ABANDONED] * 2
    assert session.status == "idle"


def test_abandoning_a_turn_settles_the_calls_it_never_started() -> None:
    session = a_session()
    turn_id = a_running_turn(session)
    a_reply_with_calls(session, turn_id, a_call("c1"), a_call("c2", "echo"))
    a_started_call(session, turn_id, "c1", Effect.SIDE_EFFECTING)
    session.interrupt_turn(turn_id, previous_worker=WORKER)
    recorded(session)

    session.abandon_turn(turn_id, reason="cannot tell", actor=OPERATOR)

    never_started = session.call("c2")
    assert never_started.settled
    assert never_started.state is CallState.FAILED
    assert never_started.error == "not run: turn abandoned: cannot tell"
    assert all(c.settled for c in session.calls_of(session.turn(turn_id)))


def test_abandoning_only_the_resolved_calls_left_keeps_their_outcome() -> None:
    session = a_session()
    turn_id = an_interrupted_turn(session, "c1", "c2")
    session.resolve_tool_call("c1", "succeeded", {"ok": True}, "checked", OPERATOR)
    recorded(session)

    given_up = session.abandon_turn(turn_id, reason="c2 unclear", actor=OPERATOR)

    assert given_up == ["c2"]
    assert session.call("c1").state is CallState.RESOLVED
    assert session.call("c2").state is CallState.ABANDONED


@pytest.mark.parametrize(
    ("reason", "actor"), [("", OPERATOR), (" ", OPERATOR), ("why", ""), ("why", "\t")]
)
def test_refuses_to_abandon_without_a_reason_and_an_actor(reason: str, actor: str) -> None:
    session = a_session()
    turn_id = an_interrupted_turn(session)

    refuse(
        session,
        lambda: session.abandon_turn(turn_id, reason, actor),
        errors.InvalidOperatorAction,
        "invalid_operator_action",
    )


@pytest.mark.parametrize(
    "finish", [a_queued_turn, a_running_turn, a_completed_turn, a_failed_turn, an_abandoned_turn]
)
def test_refuses_to_abandon_a_turn_that_is_not_interrupted(finish: Any) -> None:
    session = a_session()
    turn_id = finish(session)

    refuse(
        session,
        lambda: session.abandon_turn(turn_id, "why", OPERATOR),
        errors.InvalidTransition,
        "invalid_transition",
    )


def test_abandoning_a_turn_the_session_does_not_have_is_not_found() -> None:
    session = a_session()

    refuse(session, lambda: session.abandon_turn("nope", "why", OPERATOR), errors.TurnNotFound)


# ------------------------------------------------------------------ closing


def test_closing_a_session_records_reason_and_actor() -> None:
    session = a_session()
    a_completed_turn(session)

    session.close(reason="done", actor=OPERATOR)

    [closed] = recorded(session)
    assert type(closed) is Session.Closed
    assert (closed.reason, closed.actor) == ("done", OPERATOR)
    assert (session.closed, session.close_reason, session.status) == (True, "done", "closed")


@pytest.mark.parametrize("given", [a_queued_turn, a_running_turn])
def test_refuses_to_close_a_session_with_a_turn_in_progress(given: Any) -> None:
    session = a_session()
    given(session)

    refuse(session, lambda: session.close("done", OPERATOR), errors.TurnInProgress)


def test_refuses_to_close_a_session_with_an_interrupted_turn() -> None:
    session = a_session()
    an_interrupted_turn(session)

    refuse(session, lambda: session.close("done", OPERATOR), errors.UnresolvedTurn)


def test_refuses_to_close_a_closed_session() -> None:
    session = a_session()
    session.close("done", OPERATOR)
    recorded(session)

    refuse(session, lambda: session.close("again", OPERATOR), errors.SessionClosed)


def test_refuses_to_close_a_session_without_an_actor() -> None:
    session = a_session()

    refuse(session, lambda: session.close("done", " "), errors.InvalidOperatorAction)


# ------------------------------------------------------------------ replay


def _a_long_life() -> tuple[Session, list[Any]]:
    """A session through every kind of turn, with every event it recorded."""
    session = Session.start(title="life", system_prompt="sys", tools=["echo", "append_file"])
    events: list[Any] = []

    def step(command: Any) -> None:
        command()
        events.extend(session.collect_events())

    step(lambda: None)
    first, _ = session.submit_turn("The codeword is kiwi", "k1")
    step(lambda: session.claim_turn(first.turn_id, WORKER))
    step(lambda: session.record_model_reply(first.turn_id, 1, "Noted.", [], {"n": 1}))
    step(lambda: session.complete_turn(first.turn_id, 1, "Noted."))
    t2 = a_turn_id(session, step, "/tool echo")
    step(lambda: session.claim_turn(t2, WORKER))
    step(lambda: session.claim_turn(t2, OTHER_WORKER))
    step(lambda: session.record_model_reply(t2, 2, "", [a_call("e1", "echo", text="x")]))
    step(lambda: session.start_tool_call(t2, 2, "e1", OTHER_WORKER, Effect.READ_ONLY))
    step(lambda: session.start_tool_call(t2, 2, "e1", OTHER_WORKER, Effect.READ_ONLY))
    step(lambda: session.record_tool_succeeded(t2, 2, "e1", 2, {"text": "x"}))
    step(lambda: session.record_model_reply(t2, 2, "", [a_call("e2", "echo")]))
    step(lambda: session.start_tool_call(t2, 2, "e2", OTHER_WORKER, Effect.READ_ONLY))
    step(lambda: session.fail_turn(t2, 2, "step limit"))
    t3 = a_turn_id(session, step, "write twice")
    step(lambda: session.claim_turn(t3, WORKER))
    step(lambda: session.record_model_reply(t3, 1, "", [a_call("w1"), a_call("w2")]))
    step(lambda: session.start_tool_call(t3, 1, "w1", WORKER, Effect.SIDE_EFFECTING))
    step(lambda: session.interrupt_turn(t3, WORKER))
    step(lambda: session.resolve_tool_call("w1", "failed", "EIO", "no line", OPERATOR))
    step(lambda: session.claim_turn(t3, OTHER_WORKER))
    step(lambda: session.start_tool_call(t3, 2, "w2", OTHER_WORKER, Effect.SIDE_EFFECTING))
    step(lambda: session.interrupt_turn(t3, OTHER_WORKER))
    step(lambda: session.abandon_turn(t3, "unclear", OPERATOR))
    step(lambda: session.close("finished", OPERATOR))
    return session, events


def a_turn_id(session: Session, step: Any, message: str) -> str:
    holder: list[str] = []
    step(lambda: holder.append(session.submit_turn(message)[0].turn_id))
    return holder[0]


def test_replaying_the_recorded_events_rebuilds_an_equal_session() -> None:
    session, events = _a_long_life()

    replayed: Any = None
    for event in copy.deepcopy(events):
        replayed = event.mutate(replayed)

    assert len(events) == session.version == 26
    assert replayed == session
    assert replayed.turns == session.turns
    assert replayed.calls == session.calls
