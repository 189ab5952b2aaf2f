"""A safe call's outcome held for the turn's next save: a lost race, a stop, and one save less."""

from __future__ import annotations

import threading
from typing import Any

from turnlog.application.providers.port import FixtureProvider, ModelReply, ProviderRegistry
from turnlog.application.runtime import Runtime
from turnlog.domain.request import ModelRequest
from turnlog.domain.session import Session

ECHO = '/tool echo {"text": "hi"}'


class Meddling(FixtureProvider):
    """The fixture provider; before answering a tool's result, runs ``meddle`` once."""

    def __init__(self, meddle: Any) -> None:
        self.meddle = meddle
        self.tool_requests = 0

    def complete(self, request: ModelRequest) -> ModelReply:
        if request.messages and request.messages[-1].role == "tool":
            self.tool_requests += 1
            if self.tool_requests == 1:
                self.meddle()
        return super().complete(request)


def topics(runtime: Runtime, session_id: Any) -> list[str]:
    return [type(e).__name__ for e in runtime.sessions.events.get(session_id)]


def attempts(runtime: Runtime, session_id: Any, turn_id: str) -> list[int]:
    """The attempt each call of the turn succeeded at, as the record has them."""
    record, turn = runtime.sessions.turn_record(session_id, turn_id)
    return [record.call(call_id).attempt for call_id in turn.call_ids]


def test_a_write_that_wins_the_race_keeps_the_held_outcome(runtime: Runtime) -> None:
    """A follow-up saved while the model runs: the next save re-decides the held outcome."""
    sid = runtime.sessions.create_session(tools=["echo"]).session_id
    followups = []
    provider = Meddling(
        lambda: followups.append(runtime.sessions.submit_turn(sid, "and then?", enqueue=True))
    )
    runtime.executor.providers = ProviderRegistry([provider], "fixture")
    submitted = runtime.sessions.submit_turn(sid, ECHO)
    turn = runtime.executor.run_turn(sid, submitted.turn_id)
    assert turn.state == "completed", turn
    assert followups and followups[0].created
    names = topics(runtime, sid)
    # The follow-up came between the intent and the outcome; the call succeeded once, attempt 1.
    assert names.count("ToolCallSucceeded") == 1
    assert names.count("ToolCallStarted") == 1
    assert names.index("TurnSubmitted", names.index("ToolCallStarted")) < names.index(
        "ToolCallSucceeded"
    )
    assert attempts(runtime, sid, submitted.turn_id) == [1]
    stored = runtime.sessions.get_session(sid)
    assert stored.turn(followups[0].turn_id).state == "queued"


def test_a_turn_let_go_between_steps_saves_what_it_held(runtime: Runtime) -> None:
    """A draining worker stops after the call: the held outcome is saved before it lets go."""
    sid = runtime.sessions.create_session(tools=["echo"]).session_id
    stop = threading.Event()
    runtime.executor.observer.tool_called = lambda *a, **k: stop.set()  # type: ignore[method-assign]
    submitted = runtime.sessions.submit_turn(sid, ECHO)
    turn = runtime.executor.run_turn(sid, submitted.turn_id, stop=stop)
    assert turn.state == "running"
    names = topics(runtime, sid)
    assert names[-1] == "ToolCallSucceeded"
    session: Session = runtime.sessions.get_session(sid)
    assert not session.in_flight_calls(session.turn(submitted.turn_id))
    # The next owner goes on from the outcome: the call does not run again.
    turn = runtime.executor.run_turn(sid, submitted.turn_id)
    assert turn.state == "completed"
    assert topics(runtime, sid).count("ToolCallStarted") == 1


def test_a_held_outcome_lost_with_the_process_runs_the_call_again(runtime: Runtime) -> None:
    """The process dies in the next model call: the stream ends at the intent; re-run."""
    sid = runtime.sessions.create_session(tools=["echo"]).session_id

    class Died(BaseException):
        pass

    def die() -> None:
        raise Died

    runtime.executor.providers = ProviderRegistry([Meddling(die)], "fixture")
    submitted = runtime.sessions.submit_turn(sid, ECHO)
    try:
        runtime.executor.run_turn(sid, submitted.turn_id)
    except Died:
        pass
    else:
        raise AssertionError("the provider did not stop the turn")
    assert topics(runtime, sid)[-1] == "ToolCallStarted"
    runtime.executor.providers = ProviderRegistry([FixtureProvider()], "fixture")
    turn = runtime.executor.run_turn(sid, submitted.turn_id)
    assert turn.state == "completed"
    assert attempts(runtime, sid, submitted.turn_id) == [2]
