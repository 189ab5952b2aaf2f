"""next_request(): the provider request, built from the session's state alone."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.unit.histories import (
    OPERATOR,
    WORKER,
    a_call,
    a_completed_turn,
    a_reply_with_calls,
    a_running_turn,
    a_session,
    a_started_call,
    an_interrupted_turn,
)
from turnlog.domain.request import (
    PLACEHOLDER_ABANDONED,
    PLACEHOLDER_UNKNOWN,
    Message,
    messages_from_json,
    messages_to_json,
    next_request,
    turns_from_json,
)
from turnlog.domain.session import Session
from turnlog.domain.turns import Effect


def roles(messages: tuple[Message, ...]) -> list[str]:
    return [m.role for m in messages]


def test_the_request_starts_with_the_system_prompt_and_names_provider_model_and_tools() -> None:
    session = a_session("You are terse.", provider="fixture", model="m1", tools=["echo"])
    a_running_turn(session, "hello")

    request = next_request(session)

    assert request.messages[0] == Message("system", "You are terse.")
    assert (request.provider, request.model, request.tools) == ("fixture", "m1", ("echo",))


def test_a_session_without_a_system_prompt_sends_none() -> None:
    session = a_session("")
    a_running_turn(session, "hello")

    assert next_request(session).messages == (Message("user", "hello"),)


def test_the_request_holds_every_user_message_and_every_reply_in_order() -> None:
    session = a_session()
    a_completed_turn(session, "one", reply="first")
    a_completed_turn(session, "two", reply="second")
    a_running_turn(session, "three")

    request = next_request(session)

    assert request.messages == (
        Message("system", "You are terse."),
        Message("user", "one"),
        Message("assistant", "first"),
        Message("user", "two"),
        Message("assistant", "second"),
        Message("user", "three"),
    )


def test_a_reply_that_is_not_the_last_step_text_is_still_sent_once() -> None:
    session = a_session("")
    turn_id = a_running_turn(session, "hello")
    session.complete_turn(turn_id, 1, "done without a model step")
    a_running_turn(session, "next")

    assert next_request(session).messages == (
        Message("user", "hello"),
        Message("assistant", "done without a model step"),
        Message("user", "next"),
    )


def test_a_tool_call_is_followed_by_the_tool_message_with_its_result() -> None:
    session = a_session("")
    turn_id = a_running_turn(session, "/tool echo")
    a_reply_with_calls(session, turn_id, a_call("c1", "echo", text="x"), a_call("c2", "echo"))
    for call_id in ("c1", "c2"):
        a_started_call(session, turn_id, call_id, Effect.READ_ONLY)
    session.record_tool_succeeded(turn_id, 1, "c1", 1, {"text": "x", "n": 1})
    session.record_tool_failed(turn_id, 1, "c2", 1, "boom")

    user, assistant, first, second = next_request(session).messages

    assert user == Message("user", "/tool echo")
    assert assistant.role == "assistant"
    assert assistant.tool_calls == (
        {"call_id": "c1", "name": "echo", "arguments": {"text": "x"}},
        {"call_id": "c2", "name": "echo", "arguments": {}},
    )
    assert first == Message("tool", '{"n": 1, "text": "x"}', tool_call_id="c1", name="echo")
    assert second == Message("tool", "error: boom", tool_call_id="c2", name="echo")


def test_an_unknown_call_is_answered_with_an_explicit_placeholder() -> None:
    session = a_session("")
    an_interrupted_turn(session, "c1")

    tool = next_request(session).messages[-1]

    assert (tool.role, tool.tool_call_id, tool.content) == ("tool", "c1", PLACEHOLDER_UNKNOWN)
    assert tool.content.startswith("outcome unknown")


def test_an_abandoned_call_is_answered_with_the_abandoned_placeholder() -> None:
    session = a_session("")
    turn_id = an_interrupted_turn(session, "c1")
    session.abandon_turn(turn_id, "cannot tell", OPERATOR)
    a_running_turn(session, "next")

    messages = next_request(session).messages

    assert roles(messages) == ["user", "assistant", "tool", "user"]
    assert messages[2] == Message(
        "tool", PLACEHOLDER_ABANDONED, tool_call_id="c1", name="append_file"
    )
    assert PLACEHOLDER_ABANDONED == "outcome unknown: abandoned by operator"


def test_a_resolved_call_carries_the_result_the_operator_recorded() -> None:
    session = a_session("")
    an_interrupted_turn(session, "c1", "c2")
    session.resolve_tool_call("c1", "succeeded", {"bytes": 6}, "line is in the file", OPERATOR)
    session.resolve_tool_call("c2", "failed", "disk full", "no line", OPERATOR)

    _, _, first, second = next_request(session).messages

    assert first.content == '{"bytes": 6} (outcome recorded by operator: line is in the file)'
    assert second.content == 'error: "disk full" (outcome recorded by operator: no line)'


def test_every_tool_call_ever_made_is_answered_exactly_once() -> None:
    session = a_session()
    t1 = a_running_turn(session, "one")
    a_reply_with_calls(session, t1, a_call("a1", "echo"))
    a_started_call(session, t1, "a1", Effect.READ_ONLY)
    session.record_tool_succeeded(t1, 1, "a1", 1, "ok")
    session.record_model_reply(t1, 1, "", [a_call("a2", "echo"), a_call("a3", "echo")])
    session.fail_turn(t1, 1, "step limit")  # a2 and a3 never ran
    t2 = an_interrupted_turn(session, "b1", "b2")
    session.resolve_tool_call("b1", "succeeded", None, "checked", OPERATOR)
    session.abandon_turn(t2, "b2 unclear", OPERATOR)
    t3 = a_running_turn(session, "three")
    a_reply_with_calls(session, t3, a_call("c1"), a_call("c2"))
    a_started_call(session, t3, "c1")
    session.interrupt_turn(t3, WORKER)  # c1 unknown, c2 never started

    messages = next_request(session).messages

    asked = [c["call_id"] for m in messages for c in m.tool_calls]
    answered = [m.tool_call_id for m in messages if m.role == "tool"]
    assert asked == answered == ["a1", "a2", "a3", "b1", "b2", "c1", "c2"]


def test_building_the_request_changes_nothing_and_gives_the_same_answer_twice() -> None:
    session = a_session()
    an_interrupted_turn(session, "c1")
    version = session.version

    first, second = next_request(session), next_request(session)

    assert first == second
    assert session.version == version
    assert session.pending_events == []


def test_the_request_is_the_same_for_a_session_rebuilt_from_its_events() -> None:
    session = Session.start(system_prompt="sys")
    turn, _ = session.submit_turn("hello")
    session.claim_turn(turn.turn_id, WORKER)
    session.record_model_reply(turn.turn_id, 1, "", [a_call("c1", "echo", text="hi")])
    session.start_tool_call(turn.turn_id, 1, "c1", WORKER, Effect.READ_ONLY)
    session.record_tool_succeeded(turn.turn_id, 1, "c1", 1, {"text": "hi"})

    rebuilt: Any = None
    for event in session.collect_events():
        rebuilt = event.mutate(rebuilt)

    assert rebuilt is not None
    assert next_request(rebuilt) == next_request(session)
    assert json.loads(next_request(rebuilt).messages[-1].content) == {"text": "hi"}


def test_messages_come_back_equal_from_their_json_or_are_not_stored() -> None:
    call = {"call_id": "c1", "name": "echo", "arguments": {"text": "é", "n": [1, 2.5, None]}}
    messages = (
        Message("user", "hello"),
        Message("assistant", "", tool_calls=(call,)),
        Message("tool", "error: boom", tool_call_id="c1", name="echo"),
        Message("assistant", "done"),
    )
    text = messages_to_json(messages)
    assert text is not None
    assert messages_from_json(json.loads(text)) == messages
    assert json.loads(text)[0] == ["user", "hello"]  # defaults left out

    tupled = {"call_id": "c2", "name": "echo", "arguments": {"pair": (1, 2)}}
    assert messages_to_json((Message("assistant", "", tool_calls=(tupled,)),)) is None
    assert messages_to_json((Message("tool", "x", tool_calls=({"n": float("nan")},)),)) is None
    assert messages_to_json((Message("user", "\ud800"),)) is None


def test_turns_come_back_from_their_json_each_as_alone() -> None:
    call = {"call_id": "c1", "name": "echo", "arguments": {"text": "hi"}}
    turns = [
        (Message("user", "hello"), Message("assistant", "", tool_calls=(call,))),
        (),
        (Message("tool", "hi", tool_call_id="c1", name="echo"), Message("assistant", "done")),
        (Message("tool", "x", tool_call_id="c2"),),
    ]
    texts = [messages_to_json(t) for t in turns]
    assert None not in texts
    built = turns_from_json([json.loads(t or "") for t in texts])
    assert built == [messages_from_json(json.loads(t or "")) for t in texts] == turns
    assert all(type(m) is Message for t in built for m in t)


def test_a_stored_message_of_too_few_or_too_many_fields_is_refused() -> None:
    for row in (["user"], ["tool", "x", [], "c1", "echo", "extra"]):
        with pytest.raises((TypeError, IndexError)):
            messages_from_json([row])
