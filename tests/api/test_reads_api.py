"""Read models over HTTP: lists with cursors, filters, ?min_position, workers, projections."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import CATCHING_UP, FAST, eventually, interrupt_a_turn, new_session, problem
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.interface.http import create_app
from turnlog.projections import ProjectionSupervisor


@pytest.fixture
def reads(settings: Settings, runtime: Runtime) -> Iterator[TestClient]:
    """The API with projection runners but no worker: turns stay where a test puts them."""
    app = create_app(settings, role="api", options=CATCHING_UP)
    with (
        ProjectionSupervisor(settings, runtime.db, sessions=runtime.sessions, poll_interval=0.1),
        TestClient(app, raise_server_exceptions=False) as client,
    ):
        yield client


def test_with_role_all_a_waited_turn_is_executed_by_the_in_process_worker(
    full: TestClient,
) -> None:
    sid = new_session(full)
    stored = full.post(
        f"/v1/sessions/{sid}/turns?wait=30", json={"message": "The codeword is lapwing"}
    )
    asked = full.post(
        f"/v1/sessions/{sid}/turns?wait=30", json={"message": "What is the codeword?"}
    )

    assert stored.status_code == asked.status_code == 200
    assert asked.json()["reply"] == "The codeword is lapwing."


def test_sessions_are_listed_page_by_page_after_min_position(reads: TestClient) -> None:
    created = [reads.post("/v1/sessions", json={"title": f"s{i}"}).json() for i in range(5)]
    last = created[-1]["position"]

    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        query = f"limit=2&min_position={last}" + (f"&cursor={cursor}" if cursor else "")
        page = reads.get(f"/v1/sessions?{query}").json()
        seen += [row["session_id"] for row in page["items"]]
        pages += 1
        cursor = page["next_cursor"]
        if not cursor:
            break

    assert pages == 3
    assert seen == [c["session_id"] for c in reversed(created)]  # newest activity first


def test_sessions_are_filtered_by_status(reads: TestClient) -> None:
    idle = new_session(reads)
    busy = new_session(reads)
    position = reads.post(f"/v1/sessions/{busy}/turns", json={"message": "hi"}).json()["position"]

    listed = reads.get(f"/v1/sessions?status=busy&min_position={position}").json()["items"]
    assert [row["session_id"] for row in listed] == [busy]
    assert listed[0]["status"] == "busy" and listed[0]["turn_count"] == 1
    idle_rows = reads.get("/v1/sessions?status=idle").json()["items"]
    assert [row["session_id"] for row in idle_rows] == [idle]


def test_bad_list_queries_are_422(reads: TestClient) -> None:
    problem(reads.get("/v1/sessions?cursor=bogus"), 422, "invalid_cursor")
    problem(reads.get("/v1/sessions?status=sleepy"), 422, "validation_error")
    problem(reads.get("/v1/sessions?limit=0"), 422, "validation_error")
    problem(reads.get("/v1/sessions?min_position=-1"), 422, "validation_error")
    problem(reads.get("/v1/open-turns?state=completed"), 422, "validation_error")
    problem(reads.get("/v1/tool-calls?session_id=nope"), 422, "validation_error")


def test_a_read_model_behind_min_position_is_503_with_retry_after(api: TestClient) -> None:
    # Role api without projection runners: nothing moves the read models.
    position = api.post("/v1/sessions", json={}).json()["position"]

    lagging = api.get(f"/v1/sessions?min_position={position}")

    body = problem(lagging, 503, "read_model_lagging")
    assert body["min_position"] == position
    assert lagging.headers["retry-after"] == "1"


def test_a_min_position_past_the_end_of_the_log_is_422(reads: TestClient) -> None:
    head = reads.post("/v1/sessions", json={}).json()["position"]

    refused = problem(
        reads.get(f"/v1/sessions?min_position={head + 1000}"), 422, "validation_error"
    )

    assert refused["head"] == head


def test_open_turns_are_listed_by_state(reads: TestClient, runtime: Runtime) -> None:
    queued = new_session(reads)
    reads.post(f"/v1/sessions/{queued}/turns", json={"message": "hi"})
    blocked = new_session(reads)
    turn_id, call_id = interrupt_a_turn(runtime, blocked)
    head = reads.post("/v1/sessions", json={}).json()["position"]

    everything = reads.get(f"/v1/open-turns?min_position={head}").json()["items"]
    interrupted = reads.get("/v1/open-turns?state=interrupted").json()["items"]
    waiting = reads.get("/v1/open-turns?state=queued").json()["items"]

    assert {row["session_id"] for row in everything} == {queued, blocked}
    assert [(r["session_id"], r["turn_id"]) for r in interrupted] == [(blocked, turn_id)]
    assert interrupted[0]["unknown_call_ids"] == [call_id]
    assert interrupted[0]["previous_worker"] == "gone:1:dead"
    assert [r["session_id"] for r in waiting] == [queued]


def test_tool_calls_are_listed_by_status_session_and_tool(
    reads: TestClient, runtime: Runtime
) -> None:
    sid = new_session(reads)
    _, call_id = interrupt_a_turn(runtime, sid)
    head = reads.post("/v1/sessions", json={}).json()["position"]

    unknown = reads.get(f"/v1/tool-calls?status=unknown&min_position={head}").json()["items"]
    by_session = reads.get(f"/v1/tool-calls?session_id={sid}&tool=append_file").json()["items"]

    assert [(r["call_id"], r["tool"], r["state"]) for r in unknown] == [
        (call_id, "append_file", "unknown")
    ]
    assert [r["call_id"] for r in by_session] == [call_id]
    assert reads.get("/v1/tool-calls?tool=echo").json()["items"] == []


def test_workers_and_projections_are_listed(full: TestClient) -> None:
    workers = full.get("/v1/workers").json()["items"]
    assert [w["pid"] for w in workers] == [os.getpid()]
    assert workers[0]["stopped_at"] is None

    projections = full.get("/v1/projections").json()["items"]
    assert {p["name"] for p in projections} == {"sessions", "open_turns", "tool_calls"}
    assert all(p["running"] for p in projections)


def test_readiness_and_metrics_include_the_worker_and_projections(full: TestClient) -> None:
    ready = full.get("/readyz").json()
    assert ready["role"] == "all"
    assert ready["checks"]["worker"] is True and ready["checks"]["projections"] is True

    text = full.get("/metrics").text
    assert 'turnlog_open_turns{state="queued"}' in text
    assert 'turnlog_projection_lag_events{projection="sessions"}' in text


def test_after_a_resolve_the_in_process_worker_finishes_the_turn(
    settings: Settings, runtime: Runtime
) -> None:
    sid = str(runtime.sessions.create_session(title="blocked").session_id)
    turn_id, call_id = interrupt_a_turn(runtime, sid)  # before any worker runs
    app = create_app(settings, role="all", options=FAST)
    with TestClient(app, raise_server_exceptions=False) as client:
        resolved = client.post(
            f"/v1/sessions/{sid}/tool-calls/{call_id}/resolve",
            json={"outcome": "failed", "result": "disk full", "note": "checked", "actor": "ops"},
        )
        assert resolved.status_code == 200

        def finished() -> dict[str, str] | None:
            turn = client.get(f"/v1/sessions/{sid}/turns/{turn_id}").json()
            return turn if turn["state"] == "completed" else None

        turn = eventually(finished, deadline=20)
    assert turn["reply"].startswith("Tool append_file returned")
