"""Bearer-token auth on /v1, and tokens kept out of logs and events."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from tests.api.conftest import FAST, problem
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.interface.http import create_app

TOKEN = "tok-3f9a1c7e-not-in-logs"


@pytest.fixture
def guarded(settings: Settings, runtime: Runtime) -> Iterator[TestClient]:
    secured = settings.model_copy(update={"api_token": SecretStr(TOKEN)})
    app = create_app(secured, role="api", options=FAST)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def test_with_a_token_every_v1_route_needs_the_bearer_token(guarded: TestClient) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        refused = problem(
            guarded.post("/v1/sessions", json={}, headers=headers), 401, "unauthorized"
        )
        assert "token" in refused["detail"]
    missing = guarded.get("/v1/sessions/00000000-0000-0000-0000-000000000000")
    assert problem(missing, 401, "unauthorized")
    assert missing.headers["www-authenticate"].startswith("Bearer")

    auth = {"Authorization": f"Bearer {TOKEN}"}
    created = guarded.post("/v1/sessions", json={}, headers=auth)
    assert created.status_code == 201
    sid = created.json()["session_id"]
    assert guarded.get(f"/v1/sessions/{sid}", headers=auth).status_code == 200
    assert guarded.get(f"/v1/sessions/{sid}/events", headers=auth).status_code == 200


def test_operations_routes_and_the_schema_are_open_without_a_token(guarded: TestClient) -> None:
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
        assert guarded.get(path).status_code == 200, path
    schema = guarded.get("/openapi.json").json()
    assert "HTTPBearer" in schema["components"]["securitySchemes"]
    assert schema["paths"]["/v1/sessions"]["post"]["security"] == [{"HTTPBearer": []}]


def test_without_a_token_configured_v1_is_open(api: TestClient) -> None:
    assert api.post("/v1/sessions", json={}).status_code == 201


def test_the_token_never_reaches_logs_or_events(
    guarded: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    guarded.post("/v1/sessions", json={}, headers={"Authorization": "Bearer " + TOKEN[:-1]})
    sid = guarded.post("/v1/sessions", json={}, headers=auth).json()["session_id"]
    guarded.post(f"/v1/sessions/{sid}/turns", json={"message": "hi"}, headers=auth)
    events = guarded.get(f"/v1/sessions/{sid}/events", headers=auth).text

    assert TOKEN not in caplog.text
    assert TOKEN not in events
    assert TOKEN not in guarded.get("/metrics").text
    assert TOKEN not in repr(guarded.app.state.turnlog.process.settings)  # type: ignore[attr-defined]
