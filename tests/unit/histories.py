"""Given histories for the pure unit tests: sessions brought to a state by their own commands.

Every builder leaves the session with no pending events, so that what a test's
command records is exactly what ``recorded()`` returns afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from turnlog.domain.errors import DomainError
from turnlog.domain.session import Session, retaining
from turnlog.domain.turns import Effect

WORKER = "worker-a"
OTHER_WORKER = "worker-b"
OPERATOR = "ops@example.com"


def a_session(
    system_prompt: str = "You are terse.", *, bounded: bool = False, **fields: Any
) -> Session:
    """A new session; a retaining one by default, so a test can look at finished turns.

    The events and rules are the same either way; ``bounded=True`` gives the
    session as the application loads it, which keeps only a summary of each
    finished turn (tests of that live in test_bounded_state.py).
    """
    session = Session.start(title="demo", system_prompt=system_prompt, **fields)
    session.collect_events()
    return session if bounded else retaining(session)


def a_call(call_id: str, name: str = "append_file", **arguments: Any) -> dict[str, Any]:
    """A tool call as a model reply carries it."""
    return {"call_id": call_id, "name": name, "arguments": arguments}


def a_queued_turn(session: Session, message: str = "hello", key: str = "") -> str:
    turn, _ = session.submit_turn(message, key)
    session.collect_events()
    return turn.turn_id


def a_running_turn(session: Session, message: str = "hello", worker: str = WORKER) -> str:
    turn_id = a_queued_turn(session, message)
    session.claim_turn(turn_id, worker)
    session.collect_events()
    return turn_id


def a_reply_with_calls(session: Session, turn_id: str, *calls: dict[str, Any]) -> None:
    session.record_model_reply(turn_id, session.turn(turn_id).claim, "", list(calls))
    session.collect_events()


def a_started_call(
    session: Session, turn_id: str, call_id: str, effect: Effect = Effect.SIDE_EFFECTING
) -> None:
    turn = session.turn(turn_id)
    session.start_tool_call(turn_id, turn.claim, call_id, turn.worker_id, effect)
    session.collect_events()


def a_completed_turn(session: Session, message: str = "hello", reply: str = "hi") -> str:
    turn_id = a_running_turn(session, message)
    claim = session.turn(turn_id).claim
    session.record_model_reply(turn_id, claim, reply, [])
    session.complete_turn(turn_id, claim, reply)
    session.collect_events()
    return turn_id


def a_failed_turn(session: Session, message: str = "hello") -> str:
    turn_id = a_running_turn(session, message)
    session.fail_turn(turn_id, session.turn(turn_id).claim, "provider error: boom")
    session.collect_events()
    return turn_id


def an_interrupted_turn(session: Session, *call_ids: str, message: str = "write it") -> str:
    """A running turn whose owner died inside side-effecting calls ``call_ids`` (default c1)."""
    call_ids = call_ids or ("c1",)
    turn_id = a_running_turn(session, message)
    calls = [a_call(c, path="notes.txt", text=c) for c in call_ids]
    a_reply_with_calls(session, turn_id, *calls)
    for call_id in call_ids:
        a_started_call(session, turn_id, call_id)
    session.interrupt_turn(turn_id, previous_worker=WORKER)
    session.collect_events()
    return turn_id


def an_abandoned_turn(session: Session) -> str:
    turn_id = an_interrupted_turn(session)
    session.abandon_turn(turn_id, reason="cannot tell", actor=OPERATOR)
    session.collect_events()
    return turn_id


def recorded(session: Session) -> list[Any]:
    """The events the last command recorded."""
    return list(session.collect_events())


def event_names(events: Sequence[Any]) -> list[str]:
    return [type(e).__name__ for e in events]


def refuse(
    session: Session, command: Callable[[], Any], error: type[DomainError], code: str = ""
) -> DomainError:
    """Run a command that must be refused with ``error`` and record nothing."""
    version = session.version
    with pytest.raises(error) as raised:
        command()
    assert session.pending_events == [], "a refused command recorded an event"
    assert session.version == version
    if code:
        assert raised.value.code == code
    return raised.value
