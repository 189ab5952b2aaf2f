"""Sessions over HTTP: create (idempotently), show, close."""

from __future__ import annotations

import threading
import uuid

from fastapi.testclient import TestClient

from tests.api.conftest import new_session, problem
from turnlog.application.runtime import Runtime


def test_creating_a_session_answers_201_with_the_session_its_position_and_location(
    api: TestClient,
) -> None:
    response = api.post("/v1/sessions", json={"title": "demo", "metadata": {"team": "a"}})

    assert response.status_code == 201
    body = response.json()
    assert body["title"] == "demo"
    assert body["status"] == "idle"
    assert body["provider"] == "fixture"
    assert body["tools"] == ["append_file", "echo", "sleep"]
    assert body["metadata"] == {"team": "a"}
    assert body["version"] == 1
    assert isinstance(body["position"], int) and body["position"] > 0
    assert response.headers["location"] == f"/v1/sessions/{body['session_id']}"
    assert api.get(response.headers["location"]).json()["title"] == "demo"


def test_a_repeated_idempotency_key_with_the_same_body_returns_the_same_session(
    api: TestClient, runtime: Runtime
) -> None:
    headers = {"Idempotency-Key": "create-1"}
    first = api.post("/v1/sessions", json={"title": "once"}, headers=headers)
    again = api.post("/v1/sessions", json={"title": "once"}, headers=headers)

    assert first.status_code == again.status_code == 201
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert again.json()["session_id"] == first.json()["session_id"]
    assert again.json()["position"] == first.json()["position"]
    assert len(runtime.sessions.session_ids()) == 1


def test_an_idempotency_key_reused_with_a_different_body_is_refused_and_writes_nothing(
    api: TestClient, runtime: Runtime
) -> None:
    headers = {"Idempotency-Key": "create-2"}
    api.post("/v1/sessions", json={"title": "first"}, headers=headers)

    refused = api.post("/v1/sessions", json={"title": "second"}, headers=headers)

    problem(refused, 409, "idempotency_key_reused")
    assert len(runtime.sessions.session_ids()) == 1


def test_concurrent_creations_with_one_key_make_one_session(
    api: TestClient, runtime: Runtime
) -> None:
    results: list[int] = []

    def create() -> None:
        r = api.post("/v1/sessions", json={"title": "race"}, headers={"Idempotency-Key": "race"})
        results.append(r.status_code)

    threads = [threading.Thread(target=create) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert results == [201] * 4
    assert len(runtime.sessions.session_ids()) == 1


def test_the_same_key_in_two_namespaces_makes_two_sessions(api: TestClient) -> None:
    from turnlog.application.idempotency import session_id_for

    assert session_id_for("one", "k") != session_id_for("two", "k")


def test_invalid_creation_requests_are_422_problems(api: TestClient) -> None:
    cases = [
        {"title": "x", "unexpected": 1},
        {"tools": ["rm_rf"]},
        {"provider": "nonexistent"},
        {"metadata": {"turnlog.idempotency": {}}},
        {"title": 5},
    ]
    for body in cases:
        refused = problem(api.post("/v1/sessions", json=body), 422, "validation_error")
        assert refused["detail"].startswith(("the request is invalid", "unknown", "metadata"))
    problem(
        api.post(
            "/v1/sessions", content=b"{not json", headers={"content-type": "application/json"}
        ),
        422,
        "validation_error",
    )
    problem(
        api.post("/v1/sessions", json={}, headers={"Idempotency-Key": "has space"}),
        422,
        "validation_error",
    )


def test_an_unknown_session_is_404_and_a_malformed_id_is_422(api: TestClient) -> None:
    problem(api.get(f"/v1/sessions/{uuid.uuid4()}"), 404, "session_not_found")
    problem(api.get("/v1/sessions/not-a-uuid"), 422, "validation_error")


def test_closing_a_session_refuses_later_turns(api: TestClient) -> None:
    sid = new_session(api)

    closed = api.post(f"/v1/sessions/{sid}/close", json={"reason": "done", "actor": "ops"})

    assert closed.status_code == 200
    assert closed.json()["status"] == "closed" and closed.json()["closed"] is True
    assert closed.json()["position"] > 0
    problem(api.post(f"/v1/sessions/{sid}/turns", json={"message": "hi"}), 409, "session_closed")
    problem(
        api.post(f"/v1/sessions/{sid}/close", json={"reason": "x", "actor": "ops"}),
        409,
        "session_closed",
    )


def test_a_session_with_an_open_turn_cannot_be_closed(api: TestClient) -> None:
    sid = new_session(api)
    api.post(f"/v1/sessions/{sid}/turns", json={"message": "hi"})

    problem(
        api.post(f"/v1/sessions/{sid}/close", json={"reason": "x", "actor": "ops"}),
        409,
        "turn_in_progress",
    )
    problem(api.post(f"/v1/sessions/{sid}/close", json={"reason": "x"}), 422, "validation_error")


def test_a_session_is_created_with_its_context_policy_or_the_servers_default(
    api: TestClient, runtime: Runtime
) -> None:
    chosen = api.post("/v1/sessions", json={"context": {"max_turns": 20, "max_chars": 50000}})
    runtime.settings.context_max_turns = 8
    default = api.post("/v1/sessions", json={})
    none = api.post("/v1/sessions", json={"context": {}})

    assert chosen.json()["context"] == {"max_turns": 20, "max_chars": 50000}
    assert default.json()["context"] == {"max_turns": 8, "max_chars": None}
    assert none.json()["context"] == {"max_turns": None, "max_chars": None}
    assert chosen.json()["compaction"] is None
    shown = api.get(f"/v1/sessions/{chosen.json()['session_id']}").json()
    assert shown["context"] == {"max_turns": 20, "max_chars": 50000}


def test_a_context_policy_out_of_range_is_refused_with_422_and_nothing_is_written(
    api: TestClient, runtime: Runtime
) -> None:
    for context in ({"max_turns": 0}, {"max_chars": 999}, {"max_turns": "many"}, {"other": 1}):
        refused = api.post("/v1/sessions", json={"context": context})
        problem(refused, 422, "validation_error")
    assert runtime.sessions.session_ids() == []


def test_a_session_answers_its_counts_and_open_turn_and_pages_its_turns_newest_first(
    api: TestClient, runtime: Runtime
) -> None:
    sid = new_session(api)
    for i in range(45):
        runtime.send(uuid.UUID(sid), f"message {i}")
    runtime.sessions.submit_turn(uuid.UUID(sid), "still queued")

    shown = api.get(f"/v1/sessions/{sid}").json()
    assert "turns" not in shown
    assert shown["turn_count"] == 46
    assert shown["turn_counts"] == {"completed": 45, "queued": 1}
    assert shown["open_turn"]["message"] == "still queued"
    assert shown["last_turn"] == {"turn_id": shown["open_turn"]["turn_id"], "state": "queued"}

    messages, cursor, pages = [], None, 0
    while True:
        page = api.get(f"/v1/sessions/{sid}/turns", params={"limit": 20, "cursor": cursor})
        assert page.status_code == 200
        messages += [t["message"] for t in page.json()["items"]]
        cursor, pages = page.json()["next_cursor"], pages + 1
        if cursor is None:
            break
    assert pages == 3
    assert messages == ["still queued"] + [f"message {i}" for i in reversed(range(45))]
    problem(api.get(f"/v1/sessions/{sid}/turns", params={"cursor": "nope"}), 422, "invalid_cursor")
    problem(api.get(f"/v1/sessions/{uuid.uuid4()}/turns"), 404, "session_not_found")
