"""A session's events over HTTP: JSON pages and the live server-sent-event stream."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any
from uuid import UUID

import httpx
from fastapi.testclient import TestClient

from tests.api.conftest import FAST, eventually, live_server, new_session, problem, run_queued_turn
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.interface.http import create_app

SSE = {"Accept": "text/event-stream"}


def test_events_are_listed_with_position_version_type_time_and_payload(
    api: TestClient, runtime: Runtime
) -> None:
    sid = new_session(api, title="audit")
    turn = api.post(f"/v1/sessions/{sid}/turns", json={"message": "hello"}).json()
    run_queued_turn(runtime, sid)

    page = api.get(f"/v1/sessions/{sid}/events").json()

    events = page["events"]
    assert [e["type"] for e in events] == [
        "SessionStarted",
        "TurnSubmitted",
        "TurnClaimed",
        "ModelReplied",
        "TurnCompleted",
    ]
    assert [e["version"] for e in events] == [1, 2, 3, 4, 5]
    positions = [e["position"] for e in events]
    assert positions == sorted(positions) and len(set(positions)) == 5
    assert events[1]["position"] == turn["position"]
    assert events[0]["topic"] == "turnlog.session.SessionStarted.v1"
    assert events[0]["payload"]["title"] == "audit"
    assert events[1]["payload"]["message"] == "hello"
    assert events[4]["payload"]["reply"] == "Echo: hello"
    assert all(e["timestamp"] for e in events)
    assert page["next_after"] == 5


def test_events_page_with_after_and_limit(api: TestClient, runtime: Runtime) -> None:
    sid = new_session(api)
    api.post(f"/v1/sessions/{sid}/turns", json={"message": "hello"})
    run_queued_turn(runtime, sid)

    page = api.get(f"/v1/sessions/{sid}/events?after=2&limit=2").json()
    rest = api.get(f"/v1/sessions/{sid}/events?after={page['next_after']}").json()

    assert [e["version"] for e in page["events"]] == [3, 4]
    assert [e["version"] for e in rest["events"]] == [5]
    assert api.get(f"/v1/sessions/{sid}/events?after=5").json()["events"] == []


def test_bad_event_queries_are_422_and_an_unknown_session_404(api: TestClient) -> None:
    sid = new_session(api)
    for query in ("limit=1001", "limit=0", "after=-1"):
        problem(api.get(f"/v1/sessions/{sid}/events?{query}"), 422, "validation_error")
    problem(api.get(f"/v1/sessions/{UUID(int=7)}/events"), 404, "session_not_found")
    problem(api.get(f"/v1/sessions/{UUID(int=7)}/events", headers=SSE), 404, "session_not_found")
    problem(
        api.get(f"/v1/sessions/{sid}/events", headers={**SSE, "Last-Event-ID": "x"}),
        422,
        "validation_error",
    )


def frames(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """Parse server-sent events (and comments, as {"comment": ...}) from a stream."""
    frame: dict[str, Any] = {}
    for line in response.iter_lines():
        if line.startswith(":"):
            yield {"comment": line[1:].strip()}
        elif line == "":
            if frame:
                yield frame
            frame = {}
        else:
            field, _, value = line.partition(": ")
            frame[field] = value


def test_a_live_stream_follows_a_running_turn_and_resumes_with_last_event_id(
    settings: Settings, runtime: Runtime
) -> None:
    app = create_app(settings, role="api", options=FAST)
    with live_server(app) as url, httpx.Client(base_url=url, timeout=10) as http:
        sid = http.post("/v1/sessions", json={}).json()["session_id"]
        http.post(f"/v1/sessions/{sid}/turns", json={"message": '/tool sleep {"seconds": 0.2}'})
        worker = threading.Thread(target=run_queued_turn, args=(runtime, sid))

        seen: list[dict[str, Any]] = []
        with http.stream("GET", f"/v1/sessions/{sid}/events", headers=SSE) as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
            worker.start()  # the turn runs while we read
            for frame in frames(stream):
                if "id" in frame:
                    seen.append(frame)
                if frame.get("event") == "ToolCallStarted":
                    break  # leave in the middle of the turn
        resume_from = seen[-1]["id"]

        with http.stream(
            "GET", f"/v1/sessions/{sid}/events", headers={**SSE, "Last-Event-ID": resume_from}
        ) as stream:
            for frame in frames(stream):
                if "id" in frame:
                    seen.append(frame)
                if frame.get("event") == "TurnCompleted":
                    break
        worker.join()
        stored = http.get(f"/v1/sessions/{sid}/events").json()["events"]

    assert [int(f["id"]) for f in seen] == [e["version"] for e in stored]
    assert [f["event"] for f in seen] == [e["type"] for e in stored]
    assert [json.loads(f["data"]) for f in seen] == stored
    assert stored[-1]["payload"]["reply"].startswith("Tool sleep returned")


def test_an_idle_stream_sends_heartbeats(settings: Settings, runtime: Runtime) -> None:
    app = create_app(settings, role="api", options=FAST)
    with live_server(app) as url, httpx.Client(base_url=url, timeout=10) as http:
        sid = http.post("/v1/sessions", json={}).json()["session_id"]
        comments = []
        with http.stream("GET", f"/v1/sessions/{sid}/events?after=1", headers=SSE) as stream:
            for frame in frames(stream):
                comments.append(frame.get("comment"))
                if frame.get("comment") == "heartbeat":
                    break
        assert "id" not in comments and "heartbeat" in comments


def test_streams_over_the_limit_are_refused_with_503_until_one_closes(
    settings: Settings, runtime: Runtime
) -> None:
    app = create_app(settings, role="api", options=replace(FAST, max_streams=1))
    with live_server(app) as url, httpx.Client(base_url=url, timeout=10) as http:
        sid = http.post("/v1/sessions", json={}).json()["session_id"]
        events = f"/v1/sessions/{sid}/events"
        with http.stream("GET", events, headers=SSE) as first:
            reading = frames(first)  # kept: dropping the iterator would close the stream
            next(reading)
            refused = http.get(events, headers=SSE)
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "5"
            assert refused.json()["code"] == "too_many_streams"
            assert http.get(events).status_code == 200  # pages are not limited

        def reopened() -> bool:
            with http.stream("GET", events, headers=SSE) as again:
                return again.status_code == 200

        eventually(reopened, deadline=10, every=0.2)


def test_a_forks_first_event_shows_the_turns_it_carries_as_data(
    api: TestClient, runtime: Runtime
) -> None:
    sid = new_session(api, title="source", tools=["echo"])
    api.post(f"/v1/sessions/{sid}/turns", json={"message": '/tool echo {"text": "hi"}'})
    run_queued_turn(runtime, sid)
    latest = api.get(f"/v1/sessions/{sid}").json()["version"]
    fork = api.post(f"/v1/sessions/{sid}/fork", json={"version": latest}).json()["session_id"]

    [first] = api.get(f"/v1/sessions/{fork}/events").json()["events"]

    assert first["type"] == "SessionForked"
    [turn] = first["payload"]["inherited_turns"]  # fields, not a Python repr
    assert turn["message"] == '/tool echo {"text": "hi"}' and turn["state"] == "completed"
    assert turn["steps"][0]["call_ids"] and turn["submitted_at"]
    [call] = first["payload"]["inherited_calls"]
    assert (call["name"], call["state"], call["arguments"]) == (
        "echo",
        "succeeded",
        {"text": "hi"},
    )
