"""The client without a server: its models against /openapi.json, problems, retries, SSE.

A fake server is an ``httpx.MockTransport`` (a real implementation of the
transport port); the problems it answers are drawn by the server's own
renderer, so every code the error table knows reaches the client as it
would over the wire.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

import turnlog
from turnlog.application import errors as app_errors
from turnlog.application.settings import Settings
from turnlog.domain import errors as domain_errors
from turnlog.interface import problems
from turnlog.interface.client.calls import RetryPolicy
from turnlog.interface.client.models import OPENAPI_NAMES, Delta, Event
from turnlog.interface.http import create_app
from turnlog.interface.http.errors import render

SID = "7a1c2f4e-8f55-4a7e-9a54-6a9cf1d3a1b0"
NO_WAIT = RetryPolicy(attempts=3, backoff=0.0, max_delay=0.0)


def _subclasses(base: type) -> list[type]:
    found = []
    for cls in base.__subclasses__():
        found += [cls, *_subclasses(cls)]
    return found


# ------------------------------------------------------- models vs openapi


def _openapi() -> dict[str, Any]:
    app = create_app(Settings(database_url="postgresql://nobody@127.0.0.1:1/none"), role="api")
    return app.openapi()


def _shape(schema: Any, names: dict[str, str]) -> Any:
    """A schema without titles and descriptions, its references by the server's names."""
    if isinstance(schema, dict):
        if "$ref" in schema:
            name = schema["$ref"].rsplit("/", 1)[-1]
            return {"$ref": names.get(name, name)}
        drop = {"title", "description", "default", "examples"}
        return {k: _shape(v, names) for k, v in schema.items() if k not in drop}
    if isinstance(schema, list):
        return [_shape(v, names) for v in schema]
    return schema


@pytest.mark.parametrize("model", list(OPENAPI_NAMES), ids=lambda m: m.__name__)
def test_each_client_model_agrees_with_its_openapi_schema(model: type[BaseModel]) -> None:
    server = _openapi()["components"]["schemas"][OPENAPI_NAMES[model]]
    mine = model.model_json_schema(mode="serialization", ref_template="{model}")
    to_server = {m.__name__: n for m, n in OPENAPI_NAMES.items()}
    # The client's own defs are named by the client class; map them to the server's.
    client = _shape(mine, to_server)
    expected = _shape(server, {})
    assert client["properties"] == expected["properties"]
    assert sorted(client.get("required", [])) == sorted(expected.get("required", []))


def test_every_response_schema_of_the_api_has_a_client_model() -> None:
    spec = _openapi()
    answered = set()
    for operations in spec["paths"].values():
        for operation in operations.values():
            for response in operation["responses"].values():
                schema = response.get("content", {}).get("application/json", {}).get("schema", {})
                if "$ref" in schema:
                    answered.add(schema["$ref"].rsplit("/", 1)[-1])
    not_for_clients = {
        "ProblemOut",  # an ApiError
        "HealthOut",
        "ReadyOut",
        "OpenTurnsSummaryOut",
        "ToolCallActivityOut",
    }
    assert answered - not_for_clients - set(OPENAPI_NAMES.values()) == set()


# ------------------------------------------------------------------ problems


def _every_code() -> list[tuple[str, int]]:
    bases = (domain_errors.DomainError, app_errors.ApplicationError, problems.RequestRefused)
    cases = {}
    for base in bases:
        for cls in [base, *_subclasses(base)]:
            error = cls.__new__(cls)  # whatever its constructor wants, code and status are fixed
            Exception.__init__(error, "detail")
            problem = problems.problem_for(error)
            if problem is not None:
                cases[problem.code] = problem.status
    return sorted(cases.items())


def _client(handler: Callable[[httpx.Request], httpx.Response], **kw: Any) -> turnlog.Client:
    return turnlog.Client(
        "http://turnlog.test", transport=httpx.MockTransport(handler), retry=NO_WAIT, **kw
    )


def _rendered(problem: problems.Problem) -> httpx.Response:
    response = render(problem, "req-1")
    return httpx.Response(
        problem.status, content=bytes(response.body), headers=dict(response.headers)
    )


@pytest.mark.parametrize(("code", "status"), _every_code())
def test_every_problem_code_becomes_an_api_error_with_that_code(code: str, status: int) -> None:
    problem = problems.Problem(status, "Title", code, "what happened", {"unknown_calls": ["c1"]})
    with (
        _client(lambda request: _rendered(problem)) as client,
        pytest.raises(turnlog.ApiError) as caught,
    ):
        client.get_session(SID)
    assert (caught.value.code, caught.value.status) == (code, status)
    assert caught.value.detail == "what happened"
    assert caught.value.problem["unknown_calls"] == ["c1"]
    assert caught.value.request_id == "req-1"


def test_the_error_table_knows_the_codes_the_clients_tests_cover() -> None:
    codes = dict(_every_code())
    for code in ("turn_in_progress", "unresolved_turn", "session_closed", "session_not_found"):
        assert codes[code] in (404, 409)
    assert {"unauthorized", "validation_error", "payload_too_large", "not_ready"} <= set(codes)


@pytest.mark.parametrize(
    "answer",
    [
        httpx.Response(200, html="<html><body>Welcome to nginx</body></html>"),
        httpx.Response(404, text="Not Found"),
        httpx.Response(200, json={"hello": "world"}),
        httpx.Response(200, content=b"{not json", headers={"content-type": "application/json"}),
        httpx.Response(500, json={"detail": "Internal"}),
    ],
    ids=["html", "plain-404", "other-json", "broken-json", "json-500"],
)
def test_a_url_that_is_not_turnlog_gives_a_clear_error(answer: httpx.Response) -> None:
    with (
        _client(lambda request: answer) as client,
        pytest.raises(turnlog.NotATurnlogServer, match="turnlog server"),
    ):
        client.get_session(SID)


def test_a_base_url_that_is_not_http_is_refused_at_once() -> None:
    with pytest.raises(ValueError, match="http"):
        turnlog.Client("localhost:8000")


# ------------------------------------------------------------------- retries


def _flaky(fail: int, answer: httpx.Response) -> tuple[list[httpx.Request], Any]:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if len(seen) <= fail:
            raise httpx.ReadError("connection reset", request=request)
        return answer

    return seen, handler


def _turn(**extra: Any) -> dict[str, Any]:
    return {
        "turn_id": "t1", "state": "queued", "message": "hi", "reply": "", "error": "",
        "idempotency_key": "k", "submitted_at": None, "state_since": None, "claim": 0,
        "worker_id": "", "previous_worker": "", "reason": "", "actor": "", "steps": [],
        "tool_calls": [], "unknown_call_ids": [], **extra,
    }  # fmt: skip


def test_a_submission_whose_answer_is_lost_is_sent_again_with_the_same_key() -> None:
    seen, handler = _flaky(2, httpx.Response(202, json=_turn(session_id=SID, position=3)))
    with _client(handler) as client:
        turn = client.submit_turn(SID, "hi")
    assert turn.turn_id == "t1" and turn.position == 3
    keys = {request.headers["idempotency-key"] for request in seen}
    assert len(seen) == 3 and len(keys) == 1


def test_an_operator_action_whose_answer_is_lost_is_not_sent_again() -> None:
    seen, handler = _flaky(1, httpx.Response(200, json=_turn(session_id=SID, position=3)))
    with _client(handler) as client, pytest.raises(turnlog.ServerUnreachable):
        client.abandon_turn(SID, "t1", reason="checked", actor="ops")
    assert len(seen) == 1


def test_a_refused_connection_is_retried_even_for_an_unsafe_request() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if len(seen) == 1:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json=_turn(session_id=SID, position=3))

    with _client(handler) as client:
        client.abandon_turn(SID, "t1", reason="checked", actor="ops")
    assert len(seen) == 2


def test_a_503_is_retried_for_reads_and_raised_when_it_persists() -> None:
    unavailable = problems.Problem(
        503, "Database unavailable", "database_unavailable", "down", {}, 1
    )
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return _rendered(unavailable)

    with _client(handler) as client, pytest.raises(turnlog.ApiError) as caught:
        client.workers()
    assert caught.value.code == "database_unavailable" and len(seen) == NO_WAIT.attempts


def test_sessions_are_created_with_a_generated_idempotency_key() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(404, json={"detail": "Not Found"})

    with _client(handler) as client:
        for _ in range(2):
            with pytest.raises(turnlog.NotATurnlogServer):
                client.create_session("x")
    keys = [r.headers.get("idempotency-key") for r in seen]
    assert all(keys) and keys[0] != keys[1]


# ----------------------------------------------------------- event streams


def _frame(version: int) -> str:
    event = {
        "position": 100 + version, "version": version, "type": "TurnSubmitted",
        "topic": "t", "timestamp": "2026-01-01T00:00:00Z", "payload": {},
    }  # fmt: skip
    return f"id: {version}\nevent: TurnSubmitted\ndata: {json.dumps(event)}\n\n"


def test_follow_resumes_after_a_dropped_stream_with_last_event_id() -> None:
    asked: list[str | None] = []
    delta = {"session_id": SID, "turn_id": "t1", "step": 1, "text": "Hel"}

    def handler(request: httpx.Request) -> httpx.Response:
        last = request.headers.get("last-event-id")
        asked.append(last)
        start = int(last or 0)
        body = ": turnlog event stream\n\n" + _frame(start + 1)
        body += f"event: delta\ndata: {json.dumps(delta)}\n\n: heartbeat\n\n"
        # Each connection ends after two events (a dropped connection), one of them
        # repeated on purpose: the client must not yield it twice.
        body += _frame(start + 2) + _frame(start + 2)
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    with _client(handler) as client:
        seen: list[Event | Delta] = []
        for item in client.follow(SID, after=0, deltas=True):
            seen.append(item)
            if isinstance(item, Event) and item.version == 6:
                break
    versions = [i.version for i in seen if isinstance(i, Event)]
    assert versions == [1, 2, 3, 4, 5, 6]
    assert asked == ["0", "2", "4"]
    assert [i.text for i in seen if isinstance(i, Delta)] == ["Hel", "Hel", "Hel"]


def test_follow_without_deltas_yields_only_events() -> None:
    delta = {"session_id": SID, "turn_id": "t1", "step": 1, "text": "x"}

    def handler(request: httpx.Request) -> httpx.Response:
        body = f"event: delta\ndata: {json.dumps(delta)}\n\n" + _frame(1)
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    with _client(handler) as client:
        first = next(iter(client.follow(SID)))
    assert isinstance(first, Event)


def test_follow_of_a_url_that_is_not_turnlog_is_a_clear_error() -> None:
    with (
        _client(lambda request: httpx.Response(200, html="<p>hi</p>")) as client,
        pytest.raises(turnlog.NotATurnlogServer),
    ):
        next(iter(client.follow(SID)))


async def _async_roundtrip() -> tuple[str, list[int]]:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.headers.get("accept") == "text/event-stream":
            body = _frame(1) + _frame(2)
            return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json=_turn())

    transport = httpx.MockTransport(handler)
    async with turnlog.AsyncClient("http://t.test", transport=transport, retry=NO_WAIT) as client:
        turn = await client.get_turn(SID, "t1")
        versions = []
        async for item in client.follow(SID):
            assert isinstance(item, Event)
            versions.append(item.version)
            if item.version == 2:
                break
    return turn.turn_id, versions


def test_the_async_client_reads_turns_and_follows_events() -> None:
    import asyncio

    assert asyncio.run(_async_roundtrip()) == ("t1", [1, 2])


def test_a_session_id_must_be_a_uuid() -> None:
    with _client(lambda request: httpx.Response(500)) as client, pytest.raises(ValueError):
        client.get_session("not-a-uuid")
    assert uuid.UUID(SID)
