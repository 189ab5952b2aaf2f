"""The executor and recovery report what they do to the process's observer (metrics)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from turnlog.application.runtime import Runtime
from turnlog.domain.turns import Effect


class Recording:
    """An observer that keeps every call, with durations dropped."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def turn_claimed(self, claim: int) -> None:
        self.calls.append(("claimed", claim))

    def model_called(self, provider: str, outcome: str, seconds: float) -> None:
        assert seconds >= 0
        self.calls.append(("model", provider, outcome))

    def tokens_used(self, provider: str, usage: dict[str, Any]) -> None:
        return None  # counted in test_tracing

    def tool_started(self, tool: str) -> None:
        return None  # the calls below are those that ended

    def tool_called(self, tool: str, outcome: str, seconds: float) -> None:
        assert seconds >= 0
        self.calls.append(("tool", tool, outcome))

    def turn_ended(self, outcome: str) -> None:
        self.calls.append(("ended", outcome))


def observed(runtime: Runtime) -> Recording:
    recording = Recording()
    runtime.executor.observer = recording
    return recording


def new_session(runtime: Runtime) -> UUID:
    tools = runtime.executor.tools.names()
    return runtime.sessions.create_session(title="observed", tools=tools).session_id


def test_a_turn_reports_its_claim_model_calls_tool_calls_and_outcome(runtime: Runtime) -> None:
    seen = observed(runtime)
    sid = new_session(runtime)

    runtime.send(sid, '/tool echo {"text": "x"}')
    runtime.send(sid, "/tool nosuch {}")

    assert seen.calls == [
        ("claimed", 1),
        ("model", "fixture", "replied"),
        ("tool", "echo", "succeeded"),
        ("model", "fixture", "replied"),
        ("ended", "completed"),
        ("claimed", 1),
        ("model", "fixture", "replied"),
        ("ended", "failed"),  # the model asked for a tool that does not exist
    ]


def test_recovery_reports_a_takeover_and_an_interrupted_turn(runtime: Runtime) -> None:
    seen = observed(runtime)
    resumed, interrupted = new_session(runtime), new_session(runtime)
    claimed_by_the_dead(runtime, resumed, "hello", unsafe_call=False)
    claimed_by_the_dead(runtime, interrupted, "/tool append_file", unsafe_call=True)

    for sid in (resumed, interrupted):
        lease = runtime.leases.try_acquire(sid)
        assert lease is not None
        with lease:
            runtime.recover(sid, lease)

    assert seen.calls == [
        ("claimed", 2),  # taken over from the dead owner's claim 1
        ("model", "fixture", "replied"),
        ("ended", "completed"),
        ("ended", "interrupted"),
    ]


def claimed_by_the_dead(runtime: Runtime, sid: UUID, message: str, *, unsafe_call: bool) -> None:
    """A turn claimed by a worker that died; inside a side-effecting call if ``unsafe_call``."""
    turn_id = runtime.sessions.submit_turn(sid, message).turn_id
    claim, _ = runtime.sessions.update(sid, lambda s: s.claim_turn(turn_id, "dead-worker"))
    if not unsafe_call:
        return
    call = {"call_id": "c1", "name": "append_file", "arguments": {"path": "f", "text": "x"}}
    runtime.sessions.update(sid, lambda s: s.record_model_reply(turn_id, claim, "", [call]))
    runtime.sessions.update(
        sid,
        lambda s: s.start_tool_call(turn_id, claim, "c1", "dead-worker", Effect.SIDE_EFFECTING),
    )
