"""The client covers the API: every route has a method on both clients, with every option.

The routes come from the server's own ``/openapi.json``, so a route added to
the server without a client method fails here, as does an option (a query
parameter or a body member) the method cannot send.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from fastapi.testclient import TestClient

import turnlog
from tests.api.conftest import full  # noqa: F401  (a fixture)
from turnlog.application.settings import Settings
from turnlog.interface.client.calls import ROUTES
from turnlog.interface.http import create_app

# A route's option → the client's name for it, where the two differ.
RENAMED = {
    "multitask": "enqueue",  # ?multitask=enqueue is the flag enqueue=True
    "context": "context_max_turns",  # {"context": {"max_turns", "max_chars"}}: two arguments
    "q": "search",  # ?q= is the session search's text
}
# Sent by the client itself, not chosen per call.
IMPLIED = {"Idempotency-Key", "Last-Event-ID", "Accept", "Authorization"}


def _operations() -> list[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    app = create_app(Settings(database_url="postgresql://nobody@127.0.0.1:1/none"), role="api")
    spec = app.openapi()
    found = []
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            found.append((method.upper(), path, operation, spec["components"]["schemas"]))
    return found


def _options(operation: dict[str, Any], schemas: dict[str, Any]) -> set[str]:
    names = {p["name"] for p in operation.get("parameters", []) if p["name"] not in IMPLIED}
    body = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
    ref = body.get("schema", {}).get("$ref", "")
    if ref:
        names |= set(schemas[ref.rsplit("/", 1)[-1]].get("properties", {}))
    return {RENAMED.get(name, name) for name in names}


OPERATIONS = _operations()


@pytest.mark.parametrize(
    ("method", "path", "operation", "schemas"),
    OPERATIONS,
    ids=[f"{m} {p}" for m, p, *_ in OPERATIONS],
)
def test_every_route_has_a_method_on_both_clients_taking_every_option_it_takes(
    method: str, path: str, operation: dict[str, Any], schemas: dict[str, Any]
) -> None:
    name = ROUTES.get((method, path))
    assert name, f"{method} {path} has no client method: add one and name it in calls.ROUTES"
    sync = inspect.signature(getattr(turnlog.Client, name))
    aio = inspect.signature(getattr(turnlog.AsyncClient, name))
    assert inspect.iscoroutinefunction(getattr(turnlog.AsyncClient, name))
    assert list(sync.parameters) == list(aio.parameters), f"{name}: the clients differ"
    missing = _options(operation, schemas) - set(sync.parameters)
    assert not missing, f"Client.{name} cannot send {sorted(missing)} of {method} {path}"


def test_the_route_table_names_no_route_the_server_does_not_have() -> None:
    served = {(m, p) for m, p, *_ in OPERATIONS}
    assert set(ROUTES) - served == set()


def test_policies_deadlines_enqueue_and_the_request_at_a_version_through_the_client(
    full: TestClient,  # noqa: F811
) -> None:
    with turnlog.Client("http://testserver", transport=full._transport) as client:
        session = client.create_session(
            "covered",
            approval_policy="side_effecting",
            deadline_seconds=120,
            context_max_turns=4,
            context_max_chars=5000,
        )
        assert session.approval_policy == "side_effecting"
        assert session.deadline_seconds == 120
        assert session.context is not None
        assert (session.context.max_turns, session.context.max_chars) == (4, 5000)

        first = client.submit_turn(session.session_id, "The codeword is heron", wait=30)
        assert first.state == "completed"
        version = client.get_session(session.session_id).version
        queued = client.submit_turn(session.session_id, "again", enqueue=True, deadline_seconds=60)
        assert queued.deadline_at is not None
        client.wait_for_turn(session.session_id, queued.turn_id, timeout=60)

        request = client.get_request(session.session_id, version)
        assert [m.content for m in request.messages if m.role == "user"] == [
            "The codeword is heron"
        ]
        assert client.health().status == "ok"
        assert client.ready().status == "ready"
        assert "turnlog" in client.metrics()
        assert isinstance(client.open_turns_summary().items, list)
        activity = client.tool_call_activity(window_seconds=600, buckets=2)
        assert len(activity.buckets) == 2


def test_wait_for_turn_raises_a_typed_timeout_holding_the_turn_as_last_seen(
    settings: Settings, runtime: Any
) -> None:
    app = create_app(settings, role="api")  # nothing executes: the turn stays queued
    with (
        TestClient(app) as http,
        turnlog.Client("http://testserver", transport=http._transport) as client,
    ):
        session = client.create_session("waits")
        turn = client.submit_turn(session.session_id, "hello")
        with pytest.raises(turnlog.TurnWaitTimeout) as raised:
            client.wait_for_turn(session.session_id, turn.turn_id, timeout=0.3)
    assert raised.value.turn.turn_id == turn.turn_id
    assert raised.value.turn.state == "queued"
    assert isinstance(raised.value, turnlog.TurnlogError)
