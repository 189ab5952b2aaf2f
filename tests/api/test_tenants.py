"""One server, three namespaces, five tokens: what each token reaches, over every route.

The routes come from the app's own OpenAPI document, so a route added later
is covered without editing these tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import FAST, eventually, problem
from tests.tenants_support import (
    TenantsFile,
    body_for,
    drop_namespaces,
    fill,
    operations,
    query_for,
    tenant_settings,
)
from turnlog.application.store.database import Database
from turnlog.interface.http import create_app
from turnlog.interface.http.tenancy import needed


@dataclass
class Tenanted:
    client: TestClient
    file: TenantsFile
    a: str
    b: str
    c: str
    spec: dict[str, Any]

    def as_(self, token: str, namespace: str | None = None) -> dict[str, str]:
        return self.file.headers(token, namespace)


@pytest.fixture
def tenanted(database: Database, namespace: str, tmp_path: Path) -> Iterator[Tenanted]:
    a, b, c = f"{namespace}_a", f"{namespace}_b", f"{namespace}_c"
    file = TenantsFile(tmp_path / "tenants.toml")
    file.token("a-client", a, "client")
    file.token("a-operator", a, "operator")
    file.token("b-reader", b, "reader")
    file.token("b-operator", b, "operator")
    file.token("admin", c, "admin")
    app = create_app(
        tenant_settings(database, file, a), role="all", options=FAST, worker_concurrency=2
    )
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            spec = client.get("/openapi.json").json()
            yield Tenanted(client, file, a, b, c, spec)
    finally:
        drop_namespaces(database, (a, b, c))


def _session_with_a_turn(t: Tenanted) -> dict[str, str]:
    created = t.client.post("/v1/sessions", json={"title": "a's"}, headers=t.as_("a-client"))
    assert created.status_code == 201, created.text
    sid = created.json()["session_id"]
    turn = t.client.post(
        f"/v1/sessions/{sid}/turns?wait=30", json={"message": "hi"}, headers=t.as_("a-client")
    )
    assert turn.status_code == 200, turn.text
    return {"session_id": sid, "turn_id": turn.json()["turn_id"], "call_id": "call_x"}


def _call(t: Tenanted, method: str, path: str, operation: dict[str, Any], **kw: Any) -> Any:
    body, query = body_for(t.spec, operation), query_for(t.spec, operation)
    return t.client.request(method, path, json=body, params=query, **kw)


def test_every_route_that_takes_an_id_hides_another_namespaces_ids_behind_404(
    tenanted: Tenanted,
) -> None:
    t = tenanted
    ids = _session_with_a_turn(t)
    checked = 0
    for method, template, operation in operations(t.spec):
        if "{session_id}" not in template:
            continue
        path = fill(template, ids)
        # A token of a's own with the role the route needs reaches the session.
        own = _call(t, method, path, operation, headers=t.as_("a-operator"))
        assert own.status_code < 500, (method, template, own.text)
        assert own.status_code == 200 or own.json().get("code") != "session_not_found", (
            method,
            template,
            own.text,
        )
        # Every other namespace's token, or an admin's in another namespace, does not.
        others = [t.as_("b-operator"), t.as_("admin"), t.as_("admin", t.b)]
        if needed(method, template).rank == 0:
            others.append(t.as_("b-reader"))
        for headers in others:
            hidden = _call(t, method, path, operation, headers=headers)
            assert hidden.status_code == 404, (method, template, headers, hidden.text)
            assert hidden.json()["code"] == "session_not_found", (method, template)
        checked += 1
    assert checked >= 14  # the document still lists the id routes


def test_lists_show_only_the_tokens_namespace(tenanted: Tenanted) -> None:
    t = tenanted
    sid = _session_with_a_turn(t)["session_id"]
    lists = [
        path
        for method, path, _ in operations(t.spec)
        if method == "GET" and "{" not in path and path != "/v1/whoami"
    ]
    assert "/v1/sessions" in lists and "/v1/tool-calls" in lists
    # a's own list shows the session once its read model has it.
    eventually(
        lambda: sid in t.client.get("/v1/sessions", headers=t.as_("a-client")).text, deadline=30
    )
    for path in lists:
        for headers in (t.as_("b-reader"), t.as_("admin"), t.as_("admin", t.b)):
            answer = t.client.get(path, headers=headers)
            assert answer.status_code == 200, (path, answer.text)
            assert sid not in answer.text, (path, headers)
    assert sid in t.client.get("/v1/sessions", headers=t.as_("admin", t.a)).text


def test_a_role_that_does_not_allow_a_route_is_refused_with_403_before_any_body_is_read(
    tenanted: Tenanted,
) -> None:
    t = tenanted
    ids = {"session_id": "00000000-0000-4000-8000-000000000000", "turn_id": "t", "call_id": "c"}
    refused = 0
    for method, template, _ in operations(t.spec):
        path = fill(template, ids)
        access = needed(method, template)
        for token, role_rank in (("b-reader", 0), ("a-client", 1)):
            # A malformed body: the role is decided before the body is parsed.
            answer = t.client.request(method, path, content=b"{not json", headers=t.as_(token))
            if role_rank < access.rank:
                body = problem(answer, 403, "role_forbidden")
                assert body["needed"] == str(access)
                refused += 1
            else:
                assert answer.status_code != 403, (method, template, token)
    assert refused >= 15


def test_a_token_that_is_not_in_the_file_is_401_and_a_header_cannot_widen_a_token(
    tenanted: Tenanted,
) -> None:
    t = tenanted
    problem(t.client.get("/v1/sessions"), 401, "unauthorized")
    problem(
        t.client.get("/v1/sessions", headers={"Authorization": "Bearer guess"}),
        401,
        "unauthorized",
    )
    # Another namespace by header: the same 404 as a namespace that does not exist.
    for asked in (t.b, "nowhere"):
        problem(
            t.client.get("/v1/sessions", headers=t.as_("a-client", asked)),
            404,
            "namespace_not_found",
        )
    problem(
        t.client.get("/v1/sessions", headers=t.as_("admin", "nowhere")), 404, "namespace_not_found"
    )


def test_whoami_names_the_namespace_and_role_of_each_token(tenanted: Tenanted) -> None:
    t = tenanted
    seen = {
        name: t.client.get("/v1/whoami", headers=t.as_(name)).json()
        for name in ("a-client", "a-operator", "b-reader", "b-operator", "admin")
    }
    assert {n: (w["namespace"], w["role"]) for n, w in seen.items()} == {
        "a-client": (t.a, "client"),
        "a-operator": (t.a, "operator"),
        "b-reader": (t.b, "reader"),
        "b-operator": (t.b, "operator"),
        "admin": (t.c, "admin"),
    }
    assert seen["admin"]["namespaces"] == sorted((t.a, t.b, t.c))
    assert seen["b-reader"]["namespaces"] == [t.b]
    picked = t.client.get("/v1/whoami", headers=t.as_("admin", t.b)).json()
    assert picked["namespace"] == t.b


def test_metrics_carry_a_namespace_label_for_each_served_namespace(tenanted: Tenanted) -> None:
    t = tenanted
    _session_with_a_turn(t)
    text = t.client.get("/metrics").text
    for namespace in (t.a, t.b, t.c):
        assert f'namespace="{namespace}"' in text
    requests = [
        line
        for line in text.splitlines()
        if line.startswith("turnlog_http_requests_total{") and 'route="/v1/sessions"' in line
    ]
    assert any(f'namespace="{t.a}"' in line for line in requests), requests
