"""Purging a session over HTTP: every trace of it goes, a record stays, its routes answer 410."""

from __future__ import annotations

import json
import threading
from typing import Any
from uuid import uuid4

import psycopg
import pytest
from fastapi.testclient import TestClient
from psycopg import sql

from tests import deadlines
from tests.api.conftest import (
    CATCHING_UP,
    caught_up,
    eventually,
    live_server,
    new_session,
    problem,
)
from tests.conftest import turnlog
from tests.purge_support import needles_of, purge_record, traces
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings, schema_name
from turnlog.application.store.database import Database
from turnlog.interface.http import create_app
from turnlog.projections.queries import encode_cursor

PURGE = {"reason": "erasure request 1234", "actor": "dpo@example"}
TITLE = "purge-me-title-7f3a"
SECRET = "purge-me-secret-91c2"


def _tool_turn(client: TestClient, sid: str, text: str) -> dict[str, Any]:
    message = "/tool append_file " + json.dumps({"path": "notes.txt", "text": text})
    response = client.post(
        f"/v1/sessions/{sid}/turns", params={"wait": 20}, json={"message": message}
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    assert body["state"] == "completed", body
    return body


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Snapshots every 5 events: a purged session has some to drop."""
    return settings.model_copy(update={"snapshot_interval": 5})


@pytest.fixture
def kept(settings: Settings, runtime: Runtime) -> Any:
    """The app with a worker and the read models kept in this process (role ``all``)."""
    app = create_app(settings, role="all", options=CATCHING_UP, worker_concurrency=2)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def _session_with_history(client: TestClient, settings: Settings) -> tuple[str, list[str]]:
    """A session with turns, tool calls, a snapshot and a sandbox file; (id, turn ids)."""
    sid = new_session(client, title=TITLE, metadata={"case": SECRET})
    turns = [_tool_turn(client, sid, f"{SECRET}-{i}")["turn_id"] for i in range(3)]
    assert (settings.sandbox_root / sid / "notes.txt").read_text().count(SECRET) == 3
    return sid, turns


def test_a_purge_leaves_no_trace_of_the_session_in_any_table_and_keeps_its_record(
    kept: TestClient, settings: Settings, database: Database, namespace: str
) -> None:
    sid, turns = _session_with_history(kept, settings)
    other = new_session(kept, title="keep-me")
    needles = needles_of(sid, TITLE, SECRET, *turns)
    # Before: the session is everywhere (events, snapshots, every read model).
    before = traces(database, namespace, needles)
    assert {"sessions_events", "sessions_snapshots", "sessions_view", "tool_calls_view"} <= set(
        before
    ), before
    with psycopg.connect(database.conninfo) as conn:
        events = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.sessions_events WHERE originator_id = %s").format(
                sql.Identifier(schema_name(namespace))
            ),
            (sid,),
        ).fetchone()
    assert events is not None
    # The head an operator keeps outside the database, to verify the stream later.
    kept_head = turnlog(settings, "audit", sid, "--head")
    assert kept_head.returncode == 0, kept_head.stderr
    head_hash, _, _, head_version = kept_head.stdout.split()

    response = kept.post(f"/v1/sessions/{sid}/purge", json=PURGE)

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["session_id"] == sid and body["state"] == "done"
    assert (body["reason"], body["actor"]) == (PURGE["reason"], PURGE["actor"])
    assert body["events"] == events[0] + 1  # and the close the purge recorded first
    # The record's head is the one kept before: the stream deleted is the one known.
    assert (body["head_hash"], body["head_version"]) == (head_hash, int(head_version))
    assert body["head_version"] == events[0]
    assert traces(database, namespace, needles, skip=["purges"]) == {}
    assert not (settings.sandbox_root / sid).exists()
    stored = purge_record(database, namespace, sid)
    assert stored is not None and stored["state"] == "done" and stored["events"] == body["events"]
    assert stored["reason"] == PURGE["reason"] and stored["actor"] == PURGE["actor"]
    # The other session is untouched.
    assert kept.get(f"/v1/sessions/{other}").json()["title"] == "keep-me"


def _routes_of_a_session(client: TestClient) -> list[tuple[str, str]]:
    spec = client.get("/openapi.json").json()
    return [
        (method.upper(), path)
        for path, operations in spec["paths"].items()
        if "{session_id}" in path
        for method in operations
    ]


BODIES = {
    "/turns": {"message": "hello"},
    "/close": {"actor": "ops"},
    "/abandon": {"reason": "r", "actor": "ops"},
    "/cancel": {"reason": "r", "actor": "ops"},
    "/resolve": {"outcome": "failed", "note": "n", "actor": "ops"},
    "/approve": {"actor": "ops"},
    "/reject": {"actor": "ops", "reason": "r"},
    "/purge": PURGE,
    "/fork": {"version": 1},
}


def test_every_route_of_a_purged_session_answers_410_session_purged(
    kept: TestClient, settings: Settings
) -> None:
    sid, turns = _session_with_history(kept, settings)
    assert kept.post(f"/v1/sessions/{sid}/purge", json=PURGE).status_code == 200

    routes = _routes_of_a_session(kept)
    assert len(routes) >= 13, routes
    for method, path in routes:
        url = path.replace("{session_id}", sid).replace("{turn_id}", turns[0])
        url = url.replace("{call_id}", "call_1")
        ending = "/" + path.rsplit("/", 1)[-1]
        params = {"version": 1} if ending == "/request" else None
        body = BODIES.get(ending) if method == "POST" else None
        assert method == "GET" or body is not None, f"no body for {method} {path}"
        response = kept.request(method, url, json=body, params=params)
        found = problem(response, 410, "session_purged")
        assert sid in found["detail"] and found["purged_at"], (method, path)
    live = kept.get(f"/v1/sessions/{sid}/events", headers={"Accept": "text/event-stream"})
    problem(live, 410, "session_purged")
    cursor = encode_cursor("turns", (2,))
    for page, query in (("timeline", {}), ("turns", {"cursor": cursor})):
        fragment = kept.get(f"/console/fragments/sessions/{sid}/{page}", params=query)
        problem(fragment, 410, "session_purged")


def test_a_key_that_created_a_purged_session_does_not_create_it_again(kept: TestClient) -> None:
    headers = {"Idempotency-Key": "made-once"}
    created = kept.post("/v1/sessions", json={"title": TITLE}, headers=headers)
    sid = created.json()["session_id"]
    assert kept.post(f"/v1/sessions/{sid}/purge", json=PURGE).status_code == 200

    again = kept.post("/v1/sessions", json={"title": TITLE}, headers=headers)

    problem(again, 410, "session_purged")
    problem(kept.get(f"/v1/sessions/{sid}"), 410, "session_purged")


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"reason": "why"},
        {"actor": "ops"},
        {"reason": "", "actor": "ops"},
        {"reason": " ", "actor": "ops"},
    ],
    ids=["empty", "no actor", "no reason", "empty reason", "blank reason"],
)
def test_a_purge_without_a_reason_or_an_actor_is_422_and_changes_nothing(
    api: TestClient, database: Database, namespace: str, body: dict[str, Any]
) -> None:
    sid = new_session(api, title=TITLE)

    response = api.post(f"/v1/sessions/{sid}/purge", json=body)

    assert response.status_code == 422, response.text
    assert api.get(f"/v1/sessions/{sid}").json()["status"] == "idle"
    assert purge_record_or_none(database, namespace, sid) is None


def purge_record_or_none(database: Database, namespace: str, sid: str) -> dict[str, Any] | None:
    try:
        return purge_record(database, namespace, sid)
    except psycopg.errors.UndefinedTable:
        return None


def test_purging_an_unknown_session_is_404_and_a_purged_one_410(kept: TestClient) -> None:
    problem(kept.post(f"/v1/sessions/{uuid4()}/purge", json=PURGE), 404, "session_not_found")
    sid = new_session(kept)
    assert kept.post(f"/v1/sessions/{sid}/purge", json=PURGE).status_code == 200

    again = problem(kept.post(f"/v1/sessions/{sid}/purge", json=PURGE), 410, "session_purged")
    assert again["purged_at"]


def test_a_purge_is_refused_while_a_turn_is_open_and_changes_nothing(
    api: TestClient, database: Database, namespace: str
) -> None:
    sid = new_session(api, title=TITLE)
    queued = api.post(f"/v1/sessions/{sid}/turns", json={"message": "hello"}).json()

    refused = api.post(f"/v1/sessions/{sid}/purge", json=PURGE)

    problem(refused, 409, "turn_in_progress")
    session = api.get(f"/v1/sessions/{sid}").json()
    assert session["status"] == "busy" and not session["closed"]
    assert session["open_turn"]["turn_id"] == queued["turn_id"]
    assert purge_record_or_none(database, namespace, sid) is None


def test_the_read_models_go_on_folding_after_a_purge_leaves_a_gap_in_the_log(
    kept: TestClient, settings: Settings
) -> None:
    # The purged session's events are the latest of the log: the read models'
    # positions then name events that are gone, past the log's new head.
    first = new_session(kept, title="before")
    sid, _ = _session_with_history(kept, settings)
    written = kept.post(f"/v1/sessions/{sid}/close", json={"actor": "ops"}).json()
    caught_up(lambda: kept.get("/v1/sessions", params={"min_position": written["position"]}))
    assert kept.post(f"/v1/sessions/{sid}/purge", json=PURGE).status_code == 200
    status = {p["name"]: p for p in kept.get("/v1/projections").json()["items"]}
    assert all(p["lag_events"] == 0 for p in status.values()), status
    assert all(p["position"] > p["head"] for p in status.values()), status

    after = kept.post("/v1/sessions", json={"title": "after"}).json()
    _tool_turn(kept, after["session_id"], "after the gap")
    # A write after the turn's end: its position covers every event of the turn.
    done = kept.post(f"/v1/sessions/{after['session_id']}/close", json={"actor": "ops"}).json()

    listed = caught_up(lambda: kept.get("/v1/sessions", params={"min_position": done["position"]}))
    assert listed.status_code == 200, listed.text
    titles = [row["title"] for row in listed.json()["items"]]
    assert titles[0] == "after" and "before" in titles and TITLE not in titles, titles
    query = {"session_id": after["session_id"], "min_position": done["position"]}
    calls = caught_up(lambda: kept.get("/v1/tool-calls", params=query)).json()
    assert [c["state"] for c in calls["items"]] == ["succeeded"]
    status = {p["name"]: p for p in kept.get("/v1/projections").json()["items"]}
    assert all(p["lag_events"] == 0 and p["position"] == p["head"] for p in status.values())
    assert first in {row["session_id"] for row in listed.json()["items"]}


def test_a_position_of_a_purged_event_is_refused_as_no_event_of_this_log(
    kept: TestClient, settings: Settings
) -> None:
    sid = new_session(kept, title=TITLE)
    written = kept.post(f"/v1/sessions/{sid}/close", json={"actor": "ops"}).json()
    assert kept.post(f"/v1/sessions/{sid}/purge", json=PURGE).status_code == 200

    late = kept.get("/v1/sessions", params={"min_position": written["position"]})

    problem(late, 422, "validation_error")


def test_another_process_that_kept_the_session_in_memory_answers_410_after_the_purge(
    settings: Settings, kept: TestClient
) -> None:
    sid, _ = _session_with_history(kept, settings)
    reader = create_app(settings, role="api", options=CATCHING_UP)
    with TestClient(reader, raise_server_exceptions=False) as other:
        assert other.get(f"/v1/sessions/{sid}").json()["title"] == TITLE  # now in its cache

        assert kept.post(f"/v1/sessions/{sid}/purge", json=PURGE).status_code == 200

        def gone() -> bool:
            return other.get(f"/v1/sessions/{sid}").status_code == 410

        eventually(gone)
        problem(other.get(f"/v1/sessions/{sid}/turns"), 410, "session_purged")


def test_both_clients_purge_and_then_see_the_session_gone(settings: Settings) -> None:
    import asyncio

    import turnlog

    app = create_app(settings, role="all", options=CATCHING_UP)
    with live_server(app) as url:
        client = turnlog.Client(url)
        first = client.create_session(title=TITLE)
        record = client.purge_session(
            first.session_id, actor=PURGE["actor"], reason=PURGE["reason"]
        )
        assert record.session_id == first.session_id and record.state == "done"
        assert record.events == 2 and record.head_hash
        with pytest.raises(turnlog.ApiError) as raised:
            client.get_session(first.session_id)
        assert raised.value.code == "session_purged"

        async def purge_async() -> None:
            async with turnlog.AsyncClient(url) as aio:
                second = await aio.create_session(title=TITLE)
                done = await aio.purge_session(second.session_id, actor="ops", reason="test")
                assert done.state == "done"
                with pytest.raises(turnlog.ApiError) as again:
                    await aio.purge_session(second.session_id, actor="ops", reason="test")
                assert again.value.code == "session_purged"

        asyncio.run(purge_async())


def test_a_server_with_a_retention_period_runs_the_job_and_shows_its_metrics(
    settings: Settings,
) -> None:
    timed = settings.model_copy(update={"retention_days": 30})
    first = create_app(timed, role="all", options=CATCHING_UP)
    second = create_app(timed, role="api", options=CATCHING_UP)
    with (
        TestClient(first, raise_server_exceptions=False) as one,
        TestClient(second, raise_server_exceptions=False) as two,
    ):

        def leaders() -> list[str] | None:
            found = [
                line
                for client in (one, two)
                for line in client.get("/metrics").text.splitlines()
                if line.startswith("turnlog_retention_leading ")
            ]
            return found if sorted(found)[-1].endswith(" 1.0") else None

        # Exactly one of the two processes holds the retention lock.
        assert sorted(eventually(leaders)) == [
            "turnlog_retention_leading 0.0",
            "turnlog_retention_leading 1.0",
        ]
        text = one.get("/metrics").text + two.get("/metrics").text
        runs = [line for line in text.splitlines() if line.startswith("turnlog_retention_runs")]
        assert len(runs) == 2, runs
    plain = create_app(settings, role="api", options=CATCHING_UP)
    with TestClient(plain, raise_server_exceptions=False) as three:
        assert "turnlog_retention" not in three.get("/metrics").text


def test_a_live_event_stream_of_a_purged_session_ends_and_a_reconnect_is_410(
    settings: Settings,
) -> None:
    import httpx

    app = create_app(settings, role="all", options=CATCHING_UP)
    with live_server(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        sid = http.post("/v1/sessions", json={"title": TITLE}).json()["session_id"]
        frames: list[str] = []
        ended = threading.Event()

        def listen() -> None:
            headers = {"Accept": "text/event-stream"}
            with http.stream("GET", f"/v1/sessions/{sid}/events", headers=headers) as stream:
                for line in stream.iter_lines():
                    frames.append(line)
            ended.set()

        reader = threading.Thread(target=listen, daemon=True)
        reader.start()
        eventually(lambda: any(f.startswith("event: SessionStarted") for f in frames))
        assert not ended.is_set()

        assert http.post(f"/v1/sessions/{sid}/purge", json=PURGE).status_code == 200

        assert ended.wait(deadlines.scaled(20)), "the stream went on after the purge"
        again = http.get(f"/v1/sessions/{sid}/events", headers={"Accept": "text/event-stream"})
        assert again.status_code == 410 and again.json()["code"] == "session_purged"
