"""The OpenAI-compatible provider against a real local HTTP server, through the agent loop.

Every test runs with an API key set; after each one, the key must appear in no
stored event (raw bytes of the events and snapshots tables), in no captured
log record, and in every request only as the Authorization header.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg import sql
from pydantic import SecretStr

from tests.conftest import ROOT, raw_events, turnlog_env
from tests.deadlines import scaled
from tests.openai_stub import (
    HANG,
    Answer,
    StubOpenAI,
    chunk,
    pieces,
    raw,
    reply,
    status,
    streamed,
    streamed_tool_calls,
    tool_calls,
)
from turnlog.application.errors import LeaseLost
from turnlog.application.providers.openai_compatible import OpenAIConfig, OpenAIProvider
from turnlog.application.providers.reply_deltas import ReplyDelta
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings, schema_name
from turnlog.application.store.database import Database
from turnlog.domain.progress import Decision
from turnlog.domain.request import ModelRequest
from turnlog.interface.bootstrap import build_runtime

KEY = "sk-test-7f3a9c1e-do-not-store"
SYSTEM = "You are terse."


@pytest.fixture
def stub() -> Iterator[StubOpenAI]:
    server = StubOpenAI().start()
    yield server
    server.stop()
    for request in server.requests:  # the key travels in one place only
        assert request.headers["authorization"] == f"Bearer {KEY}"
        others = [v for k, v in request.headers.items() if k != "authorization"]
        assert KEY not in request.path and KEY.encode() not in request.body
        assert not any(KEY in v for v in others)


@pytest.fixture
def settings(settings: Settings, stub: StubOpenAI) -> Settings:
    """The shared settings, pointed at the stub, with short timeouts and retry delays."""
    return settings.model_copy(
        update={
            "openai_base_url": stub.url,
            "openai_api_key": SecretStr(KEY),
            "model": "default-model",
            "openai_timeout": 5.0,
            "openai_max_retries": 2,
            "openai_retry_backoff": 0.01,
            "openai_retry_max_delay": 0.05,
        }
    )


@pytest.fixture(autouse=True)
def key_stays_secret(
    caplog: pytest.LogCaptureFixture, settings: Settings, database: Database
) -> Iterator[None]:
    caplog.set_level(logging.DEBUG)  # httpx and httpcore log at DEBUG: capture them too
    yield
    assert KEY not in caplog.text
    assert not any(KEY in str(r.__dict__) for r in caplog.records)
    rows = stored_rows(database, settings.namespace)
    assert rows, "nothing stored: the check below would prove nothing"
    assert not any(KEY.encode() in row for row in rows)


def stored_rows(database: Database, namespace: str) -> list[bytes]:
    """Topic and state bytes of every row of the events and snapshots tables."""
    rows: list[bytes] = []
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        for table in ("sessions_events", "sessions_snapshots"):
            exists = conn.execute(
                "SELECT to_regclass(%s) IS NOT NULL", (f"{schema_name(namespace)}.{table}",)
            ).fetchone()
            if not exists or not exists[0]:
                continue
            query = sql.SQL("SELECT topic, state FROM {}.{}").format(
                sql.Identifier(schema_name(namespace)), sql.Identifier(table)
            )
            rows += [topic.encode() + bytes(state) for topic, state in conn.execute(query)]
    return rows


def openai_session(rt: Runtime, model: str = "stub-model-7") -> UUID:
    written = rt.sessions.create_session(
        system_prompt=SYSTEM, provider="openai", model=model, tools=["echo"]
    )
    return written.session_id


def topics(database: Database, namespace: str, session_id: UUID) -> list[str]:
    return [r[3].split(".")[2] for r in raw_events(database, namespace, session_id)]


# ---------------------------------------------------------------- replies


def test_a_plain_reply_completes_the_turn_with_the_sessions_model_and_tools(
    runtime: Runtime, stub: StubOpenAI
) -> None:
    session_id = openai_session(runtime, model="stub-model-7")
    stub.script(reply("Hello from the stub", {"prompt_tokens": 12, "completion_tokens": 4}))

    turn = runtime.send(session_id, "Hi").turn

    assert (turn.state, turn.reply) == ("completed", "Hello from the stub")
    assert turn.steps[0].usage == {"prompt_tokens": 12, "completion_tokens": 4}
    [request] = stub.requests
    assert request.path == "/v1/chat/completions"
    body = request.json
    assert body["model"] == "stub-model-7"  # the session's, not the default
    assert body["messages"] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Hi"},
    ]
    [echo] = body["tools"]  # the session's tools, as function tools
    assert echo["type"] == "function"
    assert echo["function"]["name"] == "echo"
    assert echo["function"]["parameters"]["properties"] == {"text": {"type": "string"}}


def test_each_session_is_served_by_the_provider_it_names(
    runtime: Runtime, stub: StubOpenAI
) -> None:
    fixture_session = runtime.sessions.create_session(provider="fixture").session_id
    assert runtime.send(fixture_session, "hello").turn.reply == "Echo: hello"
    assert stub.requests == []

    stub.script(reply("from openai"))
    assert runtime.send(openai_session(runtime), "hello").turn.reply == "from openai"
    assert len(stub.requests) == 1


def test_a_tool_call_round_trips_through_the_agent_loop(
    runtime: Runtime, stub: StubOpenAI, settings: Settings, database: Database
) -> None:
    session_id = openai_session(runtime)
    stub.script(tool_calls(("call_abc", "echo", '{"text": "ping"}')), reply("It said ping."))

    turn = runtime.send(session_id, "Echo ping").turn

    assert (turn.state, turn.reply) == ("completed", "It said ping.")
    assert topics(database, settings.namespace, session_id)[-5:] == [
        "ModelReplied",
        "ToolCallStarted",
        "ToolCallSucceeded",
        "ModelReplied",
        "TurnCompleted",
    ]
    first, second = stub.requests
    assert second.messages == [
        *first.messages,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_abc",
                    "type": "function",
                    "function": {"name": "echo", "arguments": '{"text": "ping"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_abc", "content": '{"text": "ping"}'},
    ]


# ---------------------------------------------------------------- failures


def test_rate_limits_and_server_errors_are_retried_then_the_reply_is_used(
    runtime: Runtime, stub: StubOpenAI
) -> None:
    session_id = openai_session(runtime)
    stub.script(status(429, "slow down", **{"Retry-After": "0"}), status(502), reply("made it"))

    turn = runtime.send(session_id, "Hi").turn

    assert (turn.state, turn.reply) == ("completed", "made it")
    assert len(stub.requests) == 3
    assert len({r.body for r in stub.requests}) == 1  # the same request each time


def test_retries_exhausted_fail_the_turn_naming_the_status(
    runtime: Runtime, stub: StubOpenAI
) -> None:
    session_id = openai_session(runtime)
    stub.script(status(503), status(503), status(503, "still overloaded"))

    turn = runtime.send(session_id, "Hi").turn

    assert turn.state == "failed"
    assert "HTTP 503" in turn.error and "still overloaded" in turn.error
    assert "after 3 attempts" in turn.error
    assert len(stub.requests) == 3  # max_retries=2: bounded
    stub.script(reply("back"))  # a failed turn does not block the session
    assert runtime.send(session_id, "again").turn.reply == "back"


def test_a_client_error_fails_the_turn_at_once_with_the_servers_message(
    runtime: Runtime, stub: StubOpenAI
) -> None:
    session_id = openai_session(runtime)
    stub.script(status(404, "The model `stub-model-7` does not exist"))

    turn = runtime.send(session_id, "Hi").turn

    assert turn.state == "failed"
    assert "HTTP 404" in turn.error and "does not exist" in turn.error
    assert len(stub.requests) == 1


def test_a_server_echoing_the_key_in_an_error_does_not_get_it_stored(
    runtime: Runtime, stub: StubOpenAI
) -> None:
    session_id = openai_session(runtime)
    stub.script(status(401, f"Incorrect API key provided: {KEY}"))

    turn = runtime.send(session_id, "Hi").turn

    assert turn.state == "failed"
    assert "HTTP 401" in turn.error and "Incorrect API key provided: ***" in turn.error


def test_malformed_tool_arguments_fail_the_step_not_the_process(
    runtime: Runtime, stub: StubOpenAI, settings: Settings, database: Database
) -> None:
    session_id = openai_session(runtime)
    stub.script(tool_calls(("call_bad", "echo", '{"text": "unterminated')))

    turn = runtime.send(session_id, "Hi").turn

    assert turn.state == "failed"
    assert "call_bad (echo) are not valid JSON" in turn.error
    # Nothing of the bad reply was recorded as a step, and no tool ran.
    assert topics(database, settings.namespace, session_id)[-3:] == [
        "TurnSubmitted",
        "TurnClaimed",
        "TurnFailed",
    ]
    stub.script(reply("fine now"))
    assert runtime.send(session_id, "again").turn.state == "completed"


def test_a_reply_that_is_not_json_fails_the_turn(runtime: Runtime, stub: StubOpenAI) -> None:
    session_id = openai_session(runtime)
    stub.script(raw(b"<html>upstream proxy error</html>"))

    turn = runtime.send(session_id, "Hi").turn

    assert turn.state == "failed"
    assert "malformed reply" in turn.error and "not JSON" in turn.error


def test_a_model_that_does_not_answer_in_time_fails_after_bounded_retries(
    settings: Settings, stub: StubOpenAI
) -> None:
    rt = build_runtime(settings.model_copy(update={"openai_timeout": 0.3, "openai_max_retries": 1}))
    try:
        session_id = openai_session(rt)
        stub.script(HANG, HANG)
        started = time.monotonic()

        turn = rt.send(session_id, "Hi").turn

        assert turn.state == "failed"
        assert "timeout" in turn.error and "after 2 attempts" in turn.error
        assert len(stub.requests) == 2
        assert time.monotonic() - started < scaled(5)
    finally:
        rt.close()


def test_retry_after_is_honoured_up_to_the_cap(stub: StubOpenAI, runtime: Runtime) -> None:
    runtime.sessions.create_session()  # something stored, for the autouse key check
    waits: list[float] = []
    provider = OpenAIProvider(
        OpenAIConfig(stub.url, SecretStr(KEY), "m", max_retries=3, backoff=0.2, max_delay=10),
        lambda names: [],
        sleep=waits.append,
    )
    stub.script(
        status(429, **{"Retry-After": "7"}),
        status(429, **{"Retry-After": "3600"}),
        status(500),
        reply("ok"),
    )
    try:
        result = provider.complete(ModelRequest("openai", "m", ()))
    finally:
        provider.close()
    assert result.text == "ok"
    assert waits[:2] == [7.0, 10.0]  # as asked; then capped at max_delay
    assert 0.4 <= waits[2] <= 0.8  # third retry: backoff 0.2 * 2**2, jittered to 50-100%


# ---------------------------------------------------------------- restart


def test_a_fresh_process_continues_a_killed_turn_sending_the_full_history(
    runtime: Runtime, stub: StubOpenAI, settings: Settings, database: Database
) -> None:
    session_id = openai_session(runtime)
    stub.script(reply("Noted."))
    assert runtime.send(session_id, "The codeword is amber").turn.reply == "Noted."

    # Another process runs the next turn: its tool call completes, then it dies
    # while waiting for the model's next reply. The read-only outcome was held for
    # the save after that reply (docs/durability.md): the stream ends at the intent.
    stub.script(tool_calls(("call_k", "echo", '{"text": "kept"}')), HANG)
    proc = spawn_send(settings, session_id, "Echo kept")
    try:
        stub.wait_for_requests(3)
    finally:
        proc.send_signal(signal.SIGKILL)
        output, errors = proc.communicate(timeout=10)
    assert KEY not in output + errors
    assert topics(database, settings.namespace, session_id)[-1] == "ToolCallStarted"

    fresh = build_runtime(settings)  # new objects, new pool: only the events carry over
    try:
        stub.script(reply("Resumed: kept."))
        verdicts = continue_once_released(fresh, session_id)
        turn = fresh.sessions.get_record(session_id).turns[-1]
    finally:
        fresh.close()

    assert verdicts[0].decision is Decision.RERUN, verdicts  # echo is read-only: run again
    assert (turn.state, turn.reply) == ("completed", "Resumed: kept.")
    dead, rebuilt = stub.requests[2], stub.requests[3]
    assert rebuilt.json == dead.json  # the fresh process rebuilt exactly what was sent before
    assert rebuilt.messages == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "The codeword is amber"},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "Echo kept"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_k",
                    "type": "function",
                    "function": {"name": "echo", "arguments": '{"text": "kept"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_k", "content": '{"text": "kept"}'},
    ]


def continue_once_released(rt: Runtime, session_id: UUID, deadline: float = 10.0) -> Any:
    """Continue the session as soon as the server has noticed the dead owner's lease is gone."""
    end = time.monotonic() + scaled(deadline)
    while True:
        try:
            return rt.continue_session(session_id)
        except LeaseLost:
            if time.monotonic() > end:
                raise
            time.sleep(0.05)


def spawn_send(settings: Settings, session_id: UUID, message: str) -> subprocess.Popen[str]:
    assert settings.openai_api_key is not None
    env: dict[str, Any] = turnlog_env(
        settings,
        TURNLOG_OPENAI_BASE_URL=settings.openai_base_url,
        TURNLOG_OPENAI_API_KEY=settings.openai_api_key.get_secret_value(),
        TURNLOG_OPENAI_RETRY_BACKOFF="0.01",
    )
    return subprocess.Popen(
        [sys.executable, "-m", "turnlog", "sessions", "send", str(session_id), message],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )


# ---------------------------------------------------------------- streaming


def collect_deltas(runtime: Runtime, session_id: UUID) -> list[ReplyDelta]:
    seen: list[ReplyDelta] = []
    runtime.executor.deltas.subscribe(session_id, seen.append)
    return seen


def test_a_streamed_reply_is_published_piece_by_piece_and_stored_whole(
    runtime: Runtime, stub: StubOpenAI, settings: Settings, database: Database
) -> None:
    session_id = openai_session(runtime)
    seen = collect_deltas(runtime, session_id)
    text = "Streaming arrives in twenty small pieces, then the whole reply is stored."
    stub.script(streamed(text, 20, usage={"prompt_tokens": 9, "completion_tokens": 20}))

    turn = runtime.send(session_id, "Hi").turn

    assert (turn.state, turn.reply) == ("completed", text)
    assert turn.steps[0].usage == {"prompt_tokens": 9, "completion_tokens": 20}
    assert [d.text for d in seen] == pieces(text, 20)
    assert [d.offset for d in seen] == [sum(map(len, pieces(text, 20)[:i])) for i in range(20)]
    assert {(d.turn_id, d.step) for d in seen} == {(turn.turn_id, 1)}
    body = stub.requests[0].json
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert topics(database, settings.namespace, session_id)[-3:] == [
        "TurnClaimed",
        "ModelReplied",
        "TurnCompleted",
    ]


def test_streamed_tool_calls_are_assembled_into_whole_calls(
    runtime: Runtime, stub: StubOpenAI
) -> None:
    session_id = openai_session(runtime)
    stub.script(
        streamed_tool_calls(
            ("call_s1", "echo", '{"text": "first piece"}'),
            ("call_s2", "echo", '{"text": "second"}'),
        ),
        streamed("Both echoed.", 4),
    )

    turn = runtime.send(session_id, "Echo twice").turn

    assert (turn.state, turn.reply) == ("completed", "Both echoed.")
    assistant, *results = stub.requests[1].messages[-3:]  # what the loop sent back
    assert [
        (c["id"], c["function"]["name"], c["function"]["arguments"])
        for c in assistant["tool_calls"]
    ] == [
        ("call_s1", "echo", '{"text": "first piece"}'),
        ("call_s2", "echo", '{"text": "second"}'),
    ]
    assert [(r["tool_call_id"], r["content"]) for r in results] == [
        ("call_s1", '{"text": "first piece"}'),
        ("call_s2", '{"text": "second"}'),
    ]


def test_a_stream_cut_before_its_end_is_retried_and_readers_are_told_it_started_over(
    runtime: Runtime, stub: StubOpenAI
) -> None:
    session_id = openai_session(runtime)
    seen = collect_deltas(runtime, session_id)
    stub.script(streamed("never finished", 5, cut_after=3), streamed("whole at last", 5))

    turn = runtime.send(session_id, "Hi").turn

    assert (turn.state, turn.reply) == ("completed", "whole at last")
    assert len(stub.requests) == 2
    assert [d.offset == 0 for d in seen] == [True, False, False, True, False, False, False, False]


def test_an_error_inside_a_stream_fails_after_retries_with_the_key_redacted(
    runtime: Runtime, stub: StubOpenAI
) -> None:
    session_id = openai_session(runtime)
    broken = Answer(
        200,
        headers={"Content-Type": "text/event-stream"},
        frames=(
            chunk({"role": "assistant", "content": "Hel"}),
            f'data: {{"error": {{"message": "overloaded for {KEY}"}}}}\n\n'.encode(),
        ),
    )
    stub.script(broken, broken, broken)

    turn = runtime.send(session_id, "Hi").turn

    assert turn.state == "failed"
    assert "after 3 attempts" in turn.error and "overloaded for ***" in turn.error
