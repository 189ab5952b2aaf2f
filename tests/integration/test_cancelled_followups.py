"""A follow-up cancelled while queued is never sent to the model."""

from __future__ import annotations

from typing import Any

from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.interface.bootstrap import build_runtime


def user_messages(runtime: Runtime, session_id: object) -> list[str]:
    session = runtime.sessions.get_session(session_id)  # type: ignore[arg-type]
    latest = runtime.sessions.request_at(session.id, session.version)
    assert [m.content for m in latest.messages] == [
        m.content for m in runtime.sessions.request_for(session).messages
    ]
    return [m.content for m in latest.messages if m.role == "user"]


def test_a_follow_up_cancelled_while_queued_never_reaches_the_model(runtime: Runtime) -> None:
    sid = runtime.sessions.create_session(title="follow-ups").session_id
    first = runtime.sessions.submit_turn(sid, "The codeword is heron")
    cancelled = runtime.sessions.submit_turn(sid, "never mind this one", enqueue=True)
    assert runtime.cancel_turn(sid, cancelled.turn_id, "not needed", "ops")
    runtime.sessions.submit_turn(sid, "What is the codeword?", enqueue=True)

    runtime.executor.run_turn(sid, first.turn_id)  # the slow turn ends; the next is current

    assert user_messages(runtime, sid) == ["The codeword is heron", "What is the codeword?"]


def test_a_turn_cancelled_before_its_first_reply_leaves_no_message_behind(
    runtime: Runtime,
) -> None:
    sid = runtime.sessions.create_session(title="cancelled").session_id
    queued = runtime.sessions.submit_turn(sid, "forget it")
    runtime.cancel_turn(sid, queued.turn_id, "changed my mind", "ops")
    runtime.sessions.submit_turn(sid, "hello")

    assert user_messages(runtime, sid) == ["hello"]


def test_a_call_held_just_before_its_start_never_starts_once_the_cancel_is_on_record(
    runtime: Runtime, settings: Settings
) -> None:
    """Another process records the cancel while this worker is about to write the call's intent."""
    sid = runtime.sessions.create_session(
        title="race", tools=["append_file"], tools_chosen=True
    ).session_id
    message = '/tool append_file {"path": "out.txt", "text": "written"}'
    turn_id = runtime.sessions.submit_turn(sid, message).turn_id
    other = build_runtime(settings)  # another process's application
    pre_state = runtime.executor._pre_state

    def held(tool: Any, session: Any, call_id: str) -> dict[str, Any]:
        state = pre_state(tool, session, call_id)
        other.cancel_turn(sid, turn_id, "stop it", "ops")  # lands before the intent's save
        return state

    runtime.executor._pre_state = held  # type: ignore[method-assign]
    try:
        turn = runtime.executor.run_turn(sid, turn_id)
    finally:
        other.close()

    topics = [type(e).__name__ for e in runtime.sessions.events.get(sid)]
    assert "CancelRequested" in topics
    assert "ToolCallStarted" not in topics, topics
    assert turn.state == "cancelled"
    assert not (settings.sandbox_root / str(sid) / "out.txt").exists()
