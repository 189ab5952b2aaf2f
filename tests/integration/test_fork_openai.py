"""A fork over the OpenAI-compatible wire format: the stub receives the same bodies.

The source runs turns with a tool call against the local stub server; forks
taken between its turns then send the source's next messages, and the bodies
the stub received for them equal those the source's turns sent.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import SecretStr

from tests.conftest import raw_events
from tests.openai_stub import StubOpenAI, reply, tool_calls
from turnlog.application.forks import fork_session
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.domain.session import Session


@pytest.fixture
def stub() -> Iterator[StubOpenAI]:
    server = StubOpenAI().start()
    yield server
    server.stop()


@pytest.fixture
def settings(settings: Settings, stub: StubOpenAI) -> Settings:
    return settings.model_copy(
        update={
            "openai_base_url": stub.url,
            "openai_api_key": SecretStr("sk-test-fork"),
            "model": "default-model",
            "openai_timeout": 5.0,
            "openai_max_retries": 0,
        }
    )


def _bodies(stub: StubOpenAI) -> list[dict[str, Any]]:
    return [r.json for r in stub.requests]


def test_a_turn_on_a_fork_sends_the_provider_the_body_the_source_sent(
    runtime: Runtime, stub: StubOpenAI, settings: Settings, database: Any
) -> None:
    sessions = runtime.sessions
    source = sessions.create_session(
        system_prompt="You are terse.", provider="openai", model="stub-model", tools=["echo"]
    ).session_id
    script = [
        (
            "Echo ping",
            [tool_calls(("call_a1", "echo", '{"text": "ping"}')), reply("It said ping.")],
        ),
        ("And now?", [reply("Nothing more.")]),
        ("Echo pong", [tool_calls(("call_b2", "echo", '{"text": "pong"}')), reply("pong it is")]),
    ]
    sent: list[list[dict[str, Any]]] = []
    for message, answers in script:
        stub.script(*answers)
        before = len(stub.requests)
        assert runtime.send(source, message).turn.state == "completed"
        sent.append(_bodies(stub)[before:])
    ends = [
        version
        for _, _, version, topic in raw_events(database, settings.namespace, source)
        if topic == Session.TurnCompleted.TOPIC
    ]

    for k in (1, 2):  # fork after turn k, then send turn k + 1's message on the fork
        fork = fork_session(sessions, source, ends[k - 1]).session_id
        assert sessions.request_for(sessions.get_session(fork)) == sessions.request_at(
            source, ends[k - 1]
        )
        message, answers = script[k]
        stub.script(*answers)
        before = len(stub.requests)
        assert runtime.send(fork, message).turn.state == "completed"
        assert _bodies(stub)[before:] == sent[k], k  # the same bodies, tool results included
