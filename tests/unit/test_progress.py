"""next_step(): what a turn needs next, decided from the session's state alone."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.histories import (
    OPERATOR,
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
)
from turnlog.domain.progress import Action, NextStep, next_step
from turnlog.domain.session import Session
from turnlog.domain.turns import MAX_TOOL_ATTEMPTS, Effect

MAX_STEPS = 3


def step_of(session: Session, turn_id: str, max_steps: int = MAX_STEPS) -> NextStep:
    return next_step(session, session.turn(turn_id), max_steps)


@pytest.mark.parametrize(
    "given",
    [a_queued_turn, a_completed_turn, a_failed_turn, an_interrupted_turn, an_abandoned_turn],
)
def test_a_turn_that_is_not_running_waits(given: Any) -> None:
    session = a_session()
    turn_id = given(session)

    assert step_of(session, turn_id) == NextStep(Action.WAIT)


def test_a_fresh_running_turn_calls_the_model() -> None:
    session = a_session()
    turn_id = a_running_turn(session)

    assert step_of(session, turn_id) == NextStep(Action.CALL_MODEL)


def test_a_requested_call_that_has_not_started_is_run_in_order() -> None:
    session = a_session()
    turn_id = a_running_turn(session)
    a_reply_with_calls(session, turn_id, a_call("c1", "echo"), a_call("c2", "echo"))

    assert step_of(session, turn_id) == NextStep(Action.RUN_TOOL, "c1")

    a_started_call(session, turn_id, "c1", Effect.READ_ONLY)
    session.record_tool_succeeded(turn_id, 1, "c1", 1, {})

    assert step_of(session, turn_id) == NextStep(Action.RUN_TOOL, "c2")


def test_the_model_is_called_again_once_every_tool_call_is_settled() -> None:
    session = a_session()
    turn_id = a_running_turn(session)
    a_reply_with_calls(session, turn_id, a_call("c1", "echo"))
    a_started_call(session, turn_id, "c1", Effect.READ_ONLY)
    session.record_tool_failed(turn_id, 1, "c1", 1, "boom")

    assert step_of(session, turn_id) == NextStep(Action.CALL_MODEL)


@pytest.mark.parametrize("effect", [Effect.READ_ONLY, Effect.IDEMPOTENT])
def test_a_safe_call_whose_attempt_never_reported_is_run_again(effect: Effect) -> None:
    session = a_session()
    turn_id = a_running_turn(session)
    a_reply_with_calls(session, turn_id, a_call("c1", "sleep"))
    a_started_call(session, turn_id, "c1", effect)

    assert step_of(session, turn_id) == NextStep(Action.RERUN_TOOL, "c1")


def test_a_safe_call_that_used_every_attempt_fails_the_turn() -> None:
    session = a_session()
    turn_id = a_running_turn(session)
    a_reply_with_calls(session, turn_id, a_call("c1", "sleep"))
    for _ in range(MAX_TOOL_ATTEMPTS):
        a_started_call(session, turn_id, "c1", Effect.READ_ONLY)

    step = step_of(session, turn_id)

    assert (step.action, step.call_id) == (Action.FAIL, "c1")
    assert f"after {MAX_TOOL_ATTEMPTS} attempts" in step.reason


def test_a_side_effecting_call_whose_attempt_never_reported_interrupts_the_turn() -> None:
    session = a_session()
    turn_id = a_running_turn(session)
    a_reply_with_calls(session, turn_id, a_call("c1"))
    a_started_call(session, turn_id, "c1", Effect.SIDE_EFFECTING)

    assert step_of(session, turn_id) == NextStep(Action.INTERRUPT, "c1")


def test_a_model_reply_without_tool_calls_completes_the_turn() -> None:
    session = a_session()
    turn_id = a_running_turn(session)
    session.record_model_reply(turn_id, 1, "hi", [])

    assert step_of(session, turn_id) == NextStep(Action.COMPLETE)


def test_the_step_limit_fails_a_turn_that_would_call_the_model_again() -> None:
    session = a_session()
    turn_id = a_running_turn(session)
    for n in range(MAX_STEPS):
        a_reply_with_calls(session, turn_id, a_call(f"c{n}", "echo"))
        a_started_call(session, turn_id, f"c{n}", Effect.READ_ONLY)
        session.record_tool_succeeded(turn_id, 1, f"c{n}", 1, {})

    assert step_of(session, turn_id, MAX_STEPS) == NextStep(
        Action.FAIL, reason=f"step limit reached ({MAX_STEPS} model calls)"
    )
    assert step_of(session, turn_id, MAX_STEPS + 1) == NextStep(Action.CALL_MODEL)


def test_a_final_reply_on_the_last_allowed_step_still_completes() -> None:
    session = a_session()
    turn_id = a_running_turn(session)
    session.record_model_reply(turn_id, 1, "hi", [])

    assert step_of(session, turn_id, max_steps=1) == NextStep(Action.COMPLETE)


def test_a_turn_resumed_after_resolution_continues_with_the_model() -> None:
    session = a_session()
    turn_id = an_interrupted_turn(session, "c1")
    session.resolve_tool_call("c1", "succeeded", None, "checked", OPERATOR)

    assert step_of(session, turn_id) == NextStep(Action.CALL_MODEL)


def test_a_turn_resumed_after_resolution_runs_the_calls_it_had_not_started() -> None:
    session = a_session()
    turn_id = a_running_turn(session)
    a_reply_with_calls(session, turn_id, a_call("c1"), a_call("c2"))
    a_started_call(session, turn_id, "c1", Effect.SIDE_EFFECTING)
    session.interrupt_turn(turn_id, "worker-a")
    session.resolve_tool_call("c1", "failed", "EIO", "no line written", OPERATOR)

    assert step_of(session, turn_id) == NextStep(Action.RUN_TOOL, "c2")
