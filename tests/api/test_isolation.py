"""Isolation and auth: two namespaces on one database, and the bearer token on every route.

Two servers, each with its own namespace, share one PostgreSQL database: no
request to one reads or changes anything of the other, and a session id of
the other namespace is 404 (as an id that exists nowhere), never 403 — the
answer must not tell that it exists. With a token set, every /v1 route
refuses a request without it, or with a wrong one (401), and the token
never appears in a log line, an answer or the database.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import sql
from pydantic import SecretStr

from tests.api.conftest import CATCHING_UP, FAST, live_server
from tests.conftest import drop_namespace, raw_events
from tests.fault.cluster import cluster
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database
from turnlog.interface.http import create_app

TOKEN = "tok-" + uuid.uuid4().hex  # a fresh secret per run: any sighting is a leak


@pytest.fixture
def other(settings: Settings, database: Database) -> Iterator[Settings]:
    """A second namespace in the same database, dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield settings.model_copy(update={"namespace": name, "data_dir": settings.data_dir / "b"})
    drop_namespace(database, name)


@pytest.fixture
def servers(settings: Settings, other: Settings) -> Iterator[tuple[str, str]]:
    with (
        live_server(create_app(settings, role="all", options=CATCHING_UP)) as a,
        live_server(create_app(other, role="all", options=CATCHING_UP)) as b,
    ):
        yield a, b


def a_session_with_a_call(url: str) -> dict[str, str]:
    sid = httpx.post(f"{url}/v1/sessions", json={}, headers={"Idempotency-Key": "same"}).json()[
        "session_id"
    ]
    turn = httpx.post(
        f"{url}/v1/sessions/{sid}/turns?wait=30",
        json={"message": '/tool echo {"text": "mine"}'},
        timeout=40,
    ).json()
    assert turn["state"] == "completed", turn
    return {
        "session_id": sid,
        "turn_id": turn["turn_id"],
        "call_id": turn["tool_calls"][0]["call_id"],
        "position": str(turn["position"]),
    }


def test_two_namespaces_on_one_database_never_see_or_change_each_other(
    servers: tuple[str, str], database: Database, settings: Settings, other: Settings
) -> None:
    a, b = servers
    mine, theirs = a_session_with_a_call(a), a_session_with_a_call(b)
    assert mine["session_id"] != theirs["session_id"]  # one key, two namespaces, two sessions
    log_b = raw_events(database, other.namespace)
    sid, tid, cid = theirs["session_id"], theirs["turn_id"], theirs["call_id"]
    operator = {"reason": "r", "actor": "a"}
    answers = [
        httpx.get(f"{a}/v1/sessions/{sid}"),
        httpx.get(f"{a}/v1/sessions/{sid}/turns/{tid}"),
        httpx.get(f"{a}/v1/sessions/{sid}/events"),
        httpx.get(f"{a}/v1/sessions/{sid}/events", headers={"accept": "text/event-stream"}),
        httpx.post(f"{a}/v1/sessions/{sid}/turns", json={"message": "hijack"}),
        httpx.post(f"{a}/v1/sessions/{sid}/turns/{tid}/abandon", json=operator),
        httpx.post(
            f"{a}/v1/sessions/{sid}/tool-calls/{cid}/resolve",
            json={"outcome": "failed", "result": None, "note": "n", "actor": "a"},
        ),
        httpx.post(f"{a}/v1/sessions/{sid}/close", json=operator),
    ]
    for response in answers:
        assert response.status_code == 404, (response.request.url, response.text)
        assert response.json()["code"] == "session_not_found"
        # The same answer as for an id that exists nowhere: nothing tells them apart.
        assert sid not in response.text or "not found" in response.text
    unknown = httpx.get(f"{a}/v1/sessions/{uuid.uuid4()}")
    assert unknown.status_code == 404 and unknown.json()["code"] == "session_not_found"
    # a's read models have folded its own session (another test's open transaction
    # may hold them back for a while), so the listings below show all of a.
    caught_up = httpx.get(f"{a}/v1/sessions", params={"min_position": mine["position"]})
    assert caught_up.status_code == 200, caught_up.text
    listed = [
        httpx.get(f"{a}/v1/sessions").text,
        httpx.get(f"{a}/v1/open-turns").text,
        httpx.get(f"{a}/v1/tool-calls").text,
        httpx.get(f"{a}/v1/tool-calls", params={"session_id": sid}).text,
        httpx.get(f"{a}/v1/open-turns/summary").text,
        httpx.get(f"{a}/v1/tool-calls/activity").text,
    ]
    # (Call ids come from the deterministic fixture model: the same message makes the
    # same id in both namespaces, so the session and turn ids are what must not show.)
    assert not [text for text in listed if sid in text or tid in text]
    assert mine["session_id"] in listed[0]
    assert raw_events(database, other.namespace) == log_b  # nothing of b's changed
    workers_a = httpx.get(f"{a}/v1/workers").json()["items"]
    workers_b = httpx.get(f"{b}/v1/workers").json()["items"]
    assert not {w["worker_id"] for w in workers_a} & {w["worker_id"] for w in workers_b}


# ------------------------------------------------------------------- auth


@pytest.fixture
def guarded(settings: Settings) -> Iterator[tuple[str, Any]]:
    secured = settings.model_copy(update={"api_token": SecretStr(TOKEN)})
    app = create_app(secured, role="all", options=FAST)
    with live_server(app) as url:
        yield url, app


def v1_routes(app: Any) -> list[tuple[str, str]]:
    """(method, path template) of every /v1 operation the app serves (from its schema)."""
    return sorted(
        (method.upper(), path)
        for path, operations in app.openapi()["paths"].items()
        if path.startswith("/v1")
        for method in operations
        if method in ("get", "post", "put", "patch", "delete")
    )


def test_with_a_token_every_v1_route_refuses_a_missing_or_wrong_one_and_it_never_leaks(
    guarded: tuple[str, Any],
    settings: Settings,
    database: Database,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    url, app = guarded
    auth = {"Authorization": f"Bearer {TOKEN}"}
    sid = httpx.post(f"{url}/v1/sessions", json={}, headers=auth).json()["session_id"]
    done = httpx.post(
        f"{url}/v1/sessions/{sid}/turns?wait=30",
        json={"message": '/tool echo {"text": "x"}'},
        headers=auth,
        timeout=40,
    ).json()
    ids = {
        "session_id": sid,
        "turn_id": done["turn_id"],
        "call_id": done["tool_calls"][0]["call_id"],
    }
    wrong = [
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Bearer {TOKEN[:-1]}"},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": f"Bearer {TOKEN.upper()}"},
        {"Authorization": TOKEN},
        {"Authorization": f"Basic {TOKEN}"},
        {"X-Api-Key": TOKEN},
        {"Cookie": f"token={TOKEN}"},
    ]
    routes = v1_routes(app)
    assert len(routes) >= 15
    for method, template in routes:
        path = template.format(**ids)
        for headers in wrong:
            refused = httpx.request(method, url + path, headers=headers, json={}, timeout=30)
            assert refused.status_code == 401, (method, path, headers, refused.text)
            assert refused.headers["www-authenticate"].startswith("Bearer")
            assert refused.json()["code"] == "unauthorized"
        in_query = httpx.request(method, url + path, params={"token": TOKEN}, json={}, timeout=30)
        assert in_query.status_code == 401
        allowed = httpx.request(method, url + path, headers=auth, json={}, timeout=30)
        assert allowed.status_code != 401, (method, path)
    streamed = httpx.get(
        f"{url}/v1/sessions/{sid}/events", headers={"accept": "text/event-stream"}, timeout=10
    )
    assert streamed.status_code == 401
    # turnlog's own lines here; a real process's every line (uvicorn's too) is checked below.
    assert not [
        r for r in caplog.records if r.name.startswith("turnlog") and TOKEN in r.getMessage()
    ]
    assert TOKEN not in httpx.get(f"{url}/metrics").text
    assert not _database_mentions(database, settings, TOKEN)


def _database_mentions(database: Database, settings: Settings, text: str) -> list[str]:
    """Tables of the namespace in which ``text`` appears anywhere (as text or bytes)."""
    found = []
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (settings.schema_name,),
        ).fetchall()
        for (table,) in tables:
            query = sql.SQL("SELECT t::text FROM {}.{} AS t").format(
                sql.Identifier(settings.schema_name), sql.Identifier(table)
            )
            rows = conn.execute(query).fetchall()
            if any(text in row[0] or _hex(text) in row[0] for row in rows):
                found.append(table)
    assert found == [] or all(re.match(r"\w+", t) for t in found)
    return found


def _hex(text: str) -> str:
    return text.encode().hex()


def test_a_serving_process_never_writes_the_token_to_its_log(
    settings: Settings, database: Database
) -> None:
    """Sent right, sent wrong, sent in the URL by mistake: no line of the process shows it.

    JSON lines carry every context field (request id, session id …) on their own.
    """
    with cluster(settings, database) as c:
        api = c.api("all", TURNLOG_API_TOKEN=TOKEN, TURNLOG_LOG_FORMAT="json")
        auth = {"Authorization": f"Bearer {TOKEN}"}
        sid = c.request("POST", "/v1/sessions", json={}, headers=auth).json()["session_id"]
        c.request("POST", f"/v1/sessions/{sid}/turns?wait=30", json={"message": "x"}, headers=auth)
        for headers, params in (
            ({"Authorization": f"Bearer {TOKEN}x"}, {}),
            ({"Authorization": f"Basic {TOKEN}"}, {}),
            ({}, {"token": TOKEN}),
            ({"X-Request-ID": TOKEN}, {}),
        ):
            assert (
                c.request("GET", "/v1/sessions", headers=headers, params=params).status_code == 401
            )
        c.request("GET", f"/v1/sessions/{TOKEN}", headers=auth)  # in a path, as an id
        output = api.output()
    assert "401" in output or "unauthorized" in output.lower()
    assert TOKEN not in output
    assert not _database_mentions(database, settings, TOKEN)
