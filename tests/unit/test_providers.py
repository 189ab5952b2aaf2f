"""The fixture provider: a deterministic, offline reply that is a pure function of the request."""

from __future__ import annotations

import json

import pytest

from tests.unit.histories import WORKER, a_completed_turn, a_running_turn, a_session
from turnlog.application.providers.port import (
    FixtureProvider,
    ModelReply,
    ProviderError,
    ProviderRegistry,
)
from turnlog.domain.request import Message, ModelRequest, next_request
from turnlog.domain.turns import Effect

provider = FixtureProvider()


def reply_to(*messages: Message) -> ModelReply:
    return provider.complete(ModelRequest("fixture", "", tuple(messages)))


def user(text: str) -> Message:
    return Message("user", text)


@pytest.mark.parametrize(
    "statement", ["The codeword is kiwi", "the CODEWORD is kiwi", "ok. THE CODEWORD IS kiwi"]
)
def test_a_codeword_statement_in_any_case_is_noted(statement: str) -> None:
    assert reply_to(user(statement)).text == "Noted. I will remember the codeword."


@pytest.mark.parametrize(
    "question", ["What is the codeword?", "what is the codeword", "WHAT IS THE CODEWORD?"]
)
def test_the_codeword_is_recalled_from_earlier_messages(question: str) -> None:
    reply = reply_to(
        user("The codeword is Kiwi."),
        Message("assistant", "Noted. I will remember the codeword."),
        user("something else"),
        Message("assistant", "Echo: something else"),
        user(question),
    )

    assert reply.text == "The codeword is Kiwi."
    assert reply.tool_calls == ()


def test_the_latest_codeword_wins() -> None:
    reply = reply_to(
        user("The codeword is kiwi"), user("The codeword is mango"), user("What is the codeword?")
    )

    assert reply.text == "The codeword is mango."


def test_an_unknown_codeword_is_admitted() -> None:
    assert reply_to(user("hello"), user("What is the codeword?")).text == (
        "I do not know the codeword."
    )


def test_a_codeword_is_recalled_across_turns_of_a_session() -> None:
    session = a_session()
    a_completed_turn(
        session, "The codeword is falcon", reply="Noted. I will remember the codeword."
    )
    a_running_turn(session, "What is the codeword?")

    assert provider.complete(next_request(session)).text == "The codeword is falcon."


def test_a_tool_command_becomes_one_tool_call_with_its_json_arguments() -> None:
    reply = reply_to(user('/tool append_file {"path": "a.txt", "text": "hi"}'))

    [call] = reply.tool_calls
    assert call["name"] == "append_file"
    assert call["arguments"] == {"path": "a.txt", "text": "hi"}
    assert call["call_id"].startswith("call_1_")
    assert reply.text == ""


def test_a_tool_command_without_arguments_calls_the_tool_with_an_empty_object() -> None:
    [call] = reply_to(user("/tool echo")).tool_calls

    assert (call["name"], call["arguments"]) == ("echo", {})


def test_the_tool_call_id_is_a_function_of_the_request() -> None:
    request = (user("hi"), Message("assistant", "Echo: hi"), user('/tool echo {"text": "x"}'))

    first, again = reply_to(*request), reply_to(*request)
    later = reply_to(*request, Message("assistant", "Echo"), user('/tool echo {"text": "x"}'))

    assert first.tool_calls == again.tool_calls
    assert first.tool_calls[0]["call_id"] != later.tool_calls[0]["call_id"]


@pytest.mark.parametrize(
    ("command", "problem"),
    [
        ("/tool echo {not json", "Invalid tool arguments: "),
        ('/tool echo ["a list"]', "Invalid tool arguments: expected a JSON object"),
        ("/tool echo 42", "Invalid tool arguments: expected a JSON object"),
    ],
)
def test_invalid_tool_arguments_are_answered_in_text_without_a_call(
    command: str, problem: str
) -> None:
    reply = reply_to(user(command))

    assert reply.tool_calls == ()
    assert reply.text.startswith(problem)


def test_after_the_tool_message_the_reply_reports_the_tool_result() -> None:
    session = a_session()
    turn_id = a_running_turn(session, '/tool echo {"text": "hi"}')
    reply = provider.complete(next_request(session))
    session.record_model_reply(turn_id, 1, reply.text, reply.tool_calls)
    call_id = reply.tool_calls[0]["call_id"]
    session.start_tool_call(turn_id, 1, call_id, WORKER, Effect.READ_ONLY)
    session.record_tool_succeeded(turn_id, 1, call_id, 1, {"text": "hi"})

    final = provider.complete(next_request(session))

    assert final.text == 'Tool echo returned: {"text": "hi"}'
    assert final.tool_calls == ()
    assert json.loads(final.text.removeprefix("Tool echo returned: ")) == {"text": "hi"}


@pytest.mark.parametrize("text", ["hello there", "  spaced  ", "/toolbox", "codeword"])
def test_anything_else_is_echoed(text: str) -> None:
    assert reply_to(user(text)).text == f"Echo: {text}"


def test_the_reply_counts_the_messages_it_was_given() -> None:
    assert reply_to(user("a"), user("b")).usage == {"input_messages": 2}


def test_the_registry_gives_the_default_provider_and_refuses_an_unknown_one() -> None:
    registry = ProviderRegistry([provider], default="fixture")

    assert registry.get("") is provider
    assert registry.get("fixture") is provider
    assert registry.names() == ["fixture"]
    with pytest.raises(ProviderError):
        registry.get("openai")
