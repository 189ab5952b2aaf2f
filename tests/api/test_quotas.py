"""A namespace's quotas: past one, 429 ``quota_exceeded`` with Retry-After, and nothing written.

The API runs alone (role ``api``: turns stay queued, and queued turns count as
running), with the namespace's read models kept by a projections process of
the test's own, so the counts the quotas read are settled before each check.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import FAST, eventually, problem
from tests.conftest import raw_events
from tests.tenants_support import TenantsFile, tenant_settings
from turnlog.application.store.database import Database
from turnlog.interface.bootstrap import build_process
from turnlog.interface.http import create_app


@pytest.fixture
def quota_api(
    request: pytest.FixtureRequest, database: Database, namespace: str, tmp_path: Path
) -> Iterator[tuple[TestClient, dict[str, str]]]:
    quotas: dict[str, int] = request.param
    file = TenantsFile(tmp_path / "tenants.toml")
    file.token("team", namespace, "client")
    file.quotas[namespace] = quotas
    settings = tenant_settings(database, file, namespace)
    app = create_app(settings, role="api", options=FAST)
    with TestClient(app, raise_server_exceptions=False) as client:
        runners = build_process(settings.model_copy(update={"tenants_file": None}), "projections")
        runners.start()
        try:
            yield client, file.headers("team")
        finally:
            runners.stop()


def _settled(client: TestClient, headers: dict[str, str], path: str, count: int) -> None:
    """Wait until the read model behind ``path`` lists ``count`` items."""

    def listed() -> bool:
        return len(client.get(path, headers=headers).json()["items"]) == count

    eventually(listed, deadline=30)


def _submit(client: TestClient, headers: dict[str, str], session: dict[str, Any]) -> Any:
    path = f"/v1/sessions/{session['session_id']}/turns"
    return client.post(path, json={"message": "hi"}, headers=headers)


def _refused(response: Any, quota: str) -> dict[str, Any]:
    body = problem(response, 429, "quota_exceeded")
    assert body["quota"] == quota
    assert 1 <= int(response.headers["retry-after"]) <= 60
    return body


@pytest.mark.parametrize("quota_api", [{"max_sessions": 2}], indirect=True)
def test_max_sessions(
    quota_api: tuple[TestClient, dict[str, str]], database: Database, namespace: str
) -> None:
    client, team = quota_api
    first = client.post("/v1/sessions", json={}, headers=team).json()["session_id"]
    client.post("/v1/sessions", json={}, headers=team)
    _settled(client, team, "/v1/sessions", 2)
    before = raw_events(database, namespace)
    body = _refused(client.post("/v1/sessions", json={}, headers=team), "max_sessions")
    assert (body["limit"], body["current"]) == (2, 2)
    # A fork is a new session too.
    _refused(client.post(f"/v1/sessions/{first}/fork", json={}, headers=team), "max_sessions")
    assert raw_events(database, namespace) == before


@pytest.mark.parametrize("quota_api", [{"max_running_turns": 1}], indirect=True)
def test_max_running_turns(
    quota_api: tuple[TestClient, dict[str, str]], database: Database, namespace: str
) -> None:
    client, team = quota_api
    one, two = (client.post("/v1/sessions", json={}, headers=team).json() for _ in range(2))
    accepted = _submit(client, team, one)
    assert accepted.status_code == 202, accepted.text
    _settled(client, team, "/v1/open-turns", 1)
    before = raw_events(database, namespace)
    body = _refused(_submit(client, team, two), "max_running_turns")
    assert (body["limit"], body["current"]) == (1, 1)
    assert raw_events(database, namespace) == before


@pytest.mark.parametrize("quota_api", [{"turns_per_minute": 2}], indirect=True)
def test_turns_per_minute(
    quota_api: tuple[TestClient, dict[str, str]], database: Database, namespace: str
) -> None:
    client, team = quota_api
    sessions = [client.post("/v1/sessions", json={}, headers=team).json() for _ in range(3)]
    for s in sessions[:2]:
        answer = _submit(client, team, s)
        assert answer.status_code == 202, answer.text
    before = raw_events(database, namespace)
    _refused(_submit(client, team, sessions[2]), "turns_per_minute")
    assert raw_events(database, namespace) == before


@pytest.mark.parametrize("quota_api", [{"max_stored_bytes": 1}], indirect=True)
def test_max_stored_bytes(
    quota_api: tuple[TestClient, dict[str, str]], database: Database, namespace: str
) -> None:
    client, team = quota_api
    before = raw_events(database, namespace)
    body = _refused(client.post("/v1/sessions", json={}, headers=team), "max_stored_bytes")
    assert body["current"] > 1
    assert raw_events(database, namespace) == before == []


@pytest.mark.parametrize("quota_api", [{"max_sessions": 100}], indirect=True)
def test_whoami_shows_the_namespaces_quotas(quota_api: tuple[TestClient, dict[str, str]]) -> None:
    client, team = quota_api
    assert client.get("/v1/whoami", headers=team).json()["quotas"] == {"max_sessions": 100}
