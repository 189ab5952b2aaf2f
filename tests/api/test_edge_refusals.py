"""What the server refuses before any route runs: the token first, then methods a path lacks.

Without a token, a malformed body is 401 like any other request (it was the
JSON parser's 422: the routes' token dependency runs after FastAPI parsed the
body). A 405 lists every method of the path (RFC 9110 §15.5.6), not only
those of the first route that matched it.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.routing import iter_route_contexts
from pydantic import SecretStr

from tests.api.conftest import FAST, live_server
from tests.api.test_isolation import v1_routes
from turnlog.application.settings import Settings
from turnlog.interface.http import create_app

TOKEN = "tok-" + uuid.uuid4().hex
AUTH = {"Authorization": f"Bearer {TOKEN}"}
IDS = {"session_id": str(uuid.uuid4()), "turn_id": "t1", "call_id": "c1"}
MALFORMED = [
    (b"{not json", {"content-type": "application/json"}),
    (b'{"metadata": {"x": NaN}}', {"content-type": "application/json"}),
    (b"\xff\xfe", {"content-type": "application/json"}),
    (b"[" * 10_000, {"content-type": "application/json"}),
    (b"x" * (2 << 20), {"content-type": "application/json"}),  # over the body limit
    (b"a=b", {"content-type": "application/x-www-form-urlencoded"}),
]


@pytest.fixture
def guarded(settings: Settings) -> Iterator[tuple[str, Any]]:
    secured = settings.model_copy(update={"api_token": SecretStr(TOKEN)})
    app = create_app(secured, role="api", options=FAST)
    with live_server(app) as url:
        yield url, app


def _paths(app: Any) -> dict[str, set[str]]:
    """Every path template the app routes, with the methods its routes serve."""
    methods: dict[str, set[str]] = defaultdict(set)
    for route in iter_route_contexts(app.router.routes):
        if getattr(route, "methods", None):
            methods[route.path].update(route.methods)
    return dict(methods)


def test_without_the_token_every_v1_and_console_data_route_is_401_before_its_body_is_read(
    guarded: tuple[str, Any],
) -> None:
    url, app = guarded
    routes = v1_routes(app) + [
        ("GET", p) for p in _paths(app) if p.startswith("/console/fragments/")
    ]
    assert len(routes) >= 18
    for method, template in routes:
        path = url + template.format(**IDS)
        for content, headers in MALFORMED:
            for credentials in ({}, {"Authorization": "Bearer wrong"}):
                refused = httpx.request(
                    method, path, content=content, headers=headers | credentials, timeout=30
                )
                assert refused.status_code == 401, (method, template, content[:20], refused.text)
                assert refused.json()["code"] == "unauthorized"
                assert refused.headers["www-authenticate"].startswith("Bearer")
    # With the token, the same malformed body reaches the parser: 422.
    with_token = httpx.post(
        url + "/v1/sessions", content=b"{not json", headers=AUTH | MALFORMED[0][1], timeout=30
    )
    assert with_token.status_code == 422


def test_a_405_lists_every_method_of_the_path_on_every_path(guarded: tuple[str, Any]) -> None:
    url, app = guarded
    paths = _paths(app)
    assert paths["/v1/sessions"] >= {"GET", "POST"}
    for template, methods in paths.items():
        missing = next(m for m in ("DELETE", "PATCH", "PUT", "POST") if m not in methods)
        answer = httpx.request(
            missing, url + template.format(**IDS), headers=AUTH, json={}, timeout=30
        )
        assert answer.status_code == 405, (template, missing, answer.text)
        allowed = {m.strip() for m in answer.headers["allow"].split(",")}
        assert allowed == methods, (template, allowed, methods)
