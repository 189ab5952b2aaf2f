"""Control over running work over HTTP: cancel, deadlines, approval, follow-ups."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import eventually, interrupt_a_turn, new_session, problem, run_queued_turn
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings


def submit(client: TestClient, sid: str, message: str, **query: Any) -> dict[str, Any]:
    response = client.post(f"/v1/sessions/{sid}/turns", json={"message": message}, params=query)
    assert response.status_code in (200, 202), response.text
    body: dict[str, Any] = response.json()
    return body


def version(client: TestClient, sid: str) -> int:
    return int(client.get(f"/v1/sessions/{sid}").json()["version"])


def turn(client: TestClient, sid: str, turn_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/sessions/{sid}/turns/{turn_id}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def in_state(client: TestClient, sid: str, turn_id: str, *states: str) -> dict[str, Any] | None:
    body = turn(client, sid, turn_id)
    return body if body["state"] in states else None


CANCEL = {"reason": "not needed any more", "actor": "ops@example"}


# ------------------------------------------------------------------ cancel


def test_cancelling_a_queued_turn_cancels_it_at_once_and_unblocks_the_session(
    api: TestClient,
) -> None:
    sid = new_session(api)
    queued = submit(api, sid, "hello")

    response = api.post(f"/v1/sessions/{sid}/turns/{queued['turn_id']}/cancel", json=CANCEL)

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["cancel"] == "cancelled"
    assert body["state"] == "cancelled"
    assert (body["reason"], body["actor"]) == (CANCEL["reason"], CANCEL["actor"])
    assert api.get(f"/v1/sessions/{sid}").json()["status"] == "idle"
    assert submit(api, sid, "next")["state"] == "queued"


def test_cancelling_a_finished_turn_is_409_turn_finished_and_writes_nothing(
    api: TestClient,
) -> None:
    sid = new_session(api)
    queued = submit(api, sid, "hello")
    api.post(f"/v1/sessions/{sid}/turns/{queued['turn_id']}/cancel", json=CANCEL)
    before = version(api, sid)

    again = api.post(f"/v1/sessions/{sid}/turns/{queued['turn_id']}/cancel", json=CANCEL)

    problem(again, 409, "turn_finished")
    assert version(api, sid) == before


def test_cancelling_a_turn_of_another_session_is_404_and_writes_nothing(api: TestClient) -> None:
    sid, other = new_session(api), new_session(api)
    theirs = submit(api, other, "hello")
    before = version(api, sid), version(api, other)

    response = api.post(f"/v1/sessions/{sid}/turns/{theirs['turn_id']}/cancel", json=CANCEL)

    problem(response, 404, "turn_not_found")
    assert (version(api, sid), version(api, other)) == before
    assert turn(api, other, theirs["turn_id"])["state"] == "queued"


@pytest.mark.parametrize(
    "body",
    [{}, {"reason": "", "actor": "a"}, {"reason": "r"}, {**CANCEL, "force": "maybe"}],
)
def test_a_malformed_cancel_is_422_and_writes_nothing(
    api: TestClient, body: dict[str, Any]
) -> None:
    sid = new_session(api)
    queued = submit(api, sid, "hello")
    before = version(api, sid)

    response = api.post(f"/v1/sessions/{sid}/turns/{queued['turn_id']}/cancel", json=body)

    problem(response, 422, "validation_error")
    assert version(api, sid) == before


def test_cancelling_an_interrupted_turn_is_409_abandon_it_instead(
    api: TestClient, runtime: Runtime
) -> None:
    sid = new_session(api)
    turn_id, _ = interrupt_a_turn(runtime, sid)

    response = api.post(f"/v1/sessions/{sid}/turns/{turn_id}/cancel", json=CANCEL)

    problem(response, 409, "invalid_transition")


def test_cancelling_a_running_sleep_stops_it_and_records_the_call_cancelled(
    full: TestClient,
) -> None:
    sid = new_session(full, tools=["sleep"])
    running = submit(full, sid, '/tool sleep {"seconds": 30}')
    tid = running["turn_id"]
    eventually(
        lambda: any(c["state"] == "started" for c in turn(full, sid, tid)["tool_calls"]),
        deadline=30,
    )

    response = full.post(f"/v1/sessions/{sid}/turns/{tid}/cancel", json=CANCEL)

    assert response.status_code == 200, response.text
    assert response.json()["cancel"] == "requested"
    done = eventually(lambda: in_state(full, sid, tid, "cancelled", "completed"), deadline=20)
    assert done["state"] == "cancelled"
    assert done["reason"] == CANCEL["reason"]
    assert [c["state"] for c in done["tool_calls"]] == ["cancelled"]
    # The next turn hears about it: the cancelled call is answered with a placeholder.
    follow = submit(full, sid, "hello again", wait=30)
    assert follow["state"] == "completed"
    events = full.get(f"/v1/sessions/{sid}/events", params={"limit": 200}).json()["events"]
    assert [e["type"] for e in events].count("CancelRequested") == 1


# ------------------------------------------------------------------ follow-ups


def test_an_unknown_multitask_value_is_422_and_writes_nothing(api: TestClient) -> None:
    sid = new_session(api)
    submit(api, sid, "one")
    before = version(api, sid)

    response = api.post(
        f"/v1/sessions/{sid}/turns", json={"message": "two"}, params={"multitask": "interrupt"}
    )

    problem(response, 422, "validation_error")
    assert version(api, sid) == before


def test_enqueued_follow_ups_are_listed_in_order_and_reject_is_still_the_default(
    api: TestClient,
) -> None:
    sid = new_session(api)
    first = submit(api, sid, "one")
    second = submit(api, sid, "two", multitask="enqueue")
    third = submit(api, sid, "three", multitask="enqueue")

    problem(
        api.post(f"/v1/sessions/{sid}/turns", json={"message": "four"}), 409, "turn_in_progress"
    )
    view = api.get(f"/v1/sessions/{sid}").json()
    assert view["open_turn"]["turn_id"] == first["turn_id"]
    assert [t["turn_id"] for t in view["queued_turns"]] == [second["turn_id"], third["turn_id"]]
    assert view["turn_count"] == 3


def test_an_interrupted_session_refuses_an_enqueued_turn_too(
    api: TestClient, runtime: Runtime
) -> None:
    sid = new_session(api)
    interrupt_a_turn(runtime, sid)
    before = version(api, sid)

    response = api.post(
        f"/v1/sessions/{sid}/turns", json={"message": "two"}, params={"multitask": "enqueue"}
    )

    problem(response, 409, "unresolved_turn")
    assert version(api, sid) == before


def test_twenty_enqueued_follow_ups_complete_in_order(full: TestClient) -> None:
    sid = new_session(full)
    ids = [submit(full, sid, f"message {n}", multitask="enqueue")["turn_id"] for n in range(20)]

    eventually(lambda: in_state(full, sid, ids[-1], "completed"), deadline=120)

    replies = [turn(full, sid, t)["reply"] for t in ids]
    assert replies == [f"Echo: message {n}" for n in range(20)]
    events = full.get(f"/v1/sessions/{sid}/events", params={"limit": 1000}).json()["events"]
    completed = [e["payload"]["turn_id"] for e in events if e["type"] == "TurnCompleted"]
    assert completed == ids


def test_cancelling_a_queued_follow_up_leaves_the_others_to_run(
    api: TestClient, runtime: Runtime
) -> None:
    sid = new_session(api)
    first = submit(api, sid, "one")
    second = submit(api, sid, "two", multitask="enqueue")
    third = submit(api, sid, "three", multitask="enqueue")
    api.post(f"/v1/sessions/{sid}/turns/{second['turn_id']}/cancel", json=CANCEL)

    run_queued_turn(runtime, sid)  # the first turn
    run_queued_turn(runtime, sid)  # then the third: the second is skipped

    states = [turn(api, sid, t["turn_id"])["state"] for t in (first, second, third)]
    assert states == ["completed", "cancelled", "completed"]
    assert turn(api, sid, third["turn_id"])["reply"] == "Echo: three"


# ------------------------------------------------------------------ deadlines


@pytest.mark.parametrize("seconds", [-1, 0, 1e9, "soon"])
def test_a_bad_deadline_is_a_4xx_problem_and_writes_nothing(api: TestClient, seconds: Any) -> None:
    sid = new_session(api)
    before = version(api, sid)

    response = api.post(
        f"/v1/sessions/{sid}/turns", json={"message": "hi", "deadline_seconds": seconds}
    )

    code = "validation_error" if isinstance(seconds, str) else "invalid_deadline"
    problem(response, 422, code)
    assert version(api, sid) == before


def test_a_session_with_a_bad_default_deadline_is_refused(api: TestClient) -> None:
    response = api.post("/v1/sessions", json={"deadline_seconds": -5})

    problem(response, 422, "invalid_deadline")


def test_a_deadline_is_stored_with_the_turn_and_the_session_default_applies(
    api: TestClient,
) -> None:
    sid = new_session(api, deadline_seconds=600)

    own = submit(api, sid, "hi")
    assert own["deadline_at"] is not None
    assert api.get(f"/v1/sessions/{sid}").json()["deadline_seconds"] == 600


def test_a_queued_turn_past_its_deadline_is_cancelled_by_the_next_worker(
    api: TestClient, runtime: Runtime
) -> None:
    sid = new_session(api)
    response = api.post(
        f"/v1/sessions/{sid}/turns", json={"message": "hi", "deadline_seconds": 0.2}
    )
    tid = response.json()["turn_id"]
    eventually(lambda: _past(response.json()["deadline_at"]), deadline=10)

    run_queued_turn(runtime, sid)

    done = turn(api, sid, tid)
    assert done["state"] == "cancelled"
    assert (done["reason"], done["actor"]) == ("deadline", "turnlog")


def _past(iso: str) -> bool:
    from datetime import UTC, datetime

    return datetime.now(UTC) > datetime.fromisoformat(iso)


# ------------------------------------------------------------------ approval


def _awaiting(client: TestClient, sid: str, tid: str) -> dict[str, Any]:
    body: dict[str, Any] = eventually(
        lambda: in_state(client, sid, tid, "awaiting_approval"), deadline=30
    )
    return body


def test_a_side_effecting_call_waits_for_approval_then_runs_once(
    full: TestClient, settings: Settings
) -> None:
    sid = new_session(full, tools=["append_file"], approval_policy="side_effecting")
    args = {"path": "out.txt", "text": "approved"}
    tid = submit(full, sid, f"/tool append_file {json.dumps(args)}")["turn_id"]
    waiting = _awaiting(full, sid, tid)
    call = waiting["tool_calls"][0]
    assert call["state"] == "proposed"
    assert full.get(f"/v1/sessions/{sid}").json()["status"] == "awaiting_approval"
    sandbox = Path(settings.sandbox_root) / sid / "out.txt"
    assert not sandbox.exists()
    rows = full.get("/v1/open-turns", params={"state": "awaiting_approval"})
    eventually(
        lambda: any(
            r["turn_id"] == tid and r["proposed_call_ids"] == [call["call_id"]]
            for r in full.get("/v1/open-turns", params={"state": "awaiting_approval"}).json()[
                "items"
            ]
        )
    )
    assert rows.status_code == 200

    response = full.post(
        f"/v1/sessions/{sid}/tool-calls/{call['call_id']}/approve",
        json={"actor": "ops@example", "note": "looks fine"},
    )

    assert response.status_code == 200, response.text
    done = eventually(lambda: in_state(full, sid, tid, "completed"), deadline=30)
    assert done["tool_calls"][0]["state"] == "succeeded"
    assert done["tool_calls"][0]["approval"] == "approved"
    assert sandbox.read_text() == "approved\n"


def test_approving_with_edited_arguments_checks_them_against_the_schema(
    full: TestClient, settings: Settings
) -> None:
    sid = new_session(full, tools=["append_file"], approval_policy="all")
    args = {"path": "out.txt", "text": "asked"}
    tid = submit(full, sid, f"/tool append_file {json.dumps(args)}")["turn_id"]
    call_id = _awaiting(full, sid, tid)["tool_calls"][0]["call_id"]
    url = f"/v1/sessions/{sid}/tool-calls/{call_id}/approve"
    before = version(full, sid)

    bad = full.post(url, json={"actor": "ops", "arguments": {"path": "out.txt", "text": 5}})

    problem(bad, 422, "invalid_tool_arguments")
    assert version(full, sid) == before
    edited = {"path": "out.txt", "text": "edited"}
    assert full.post(url, json={"actor": "ops", "arguments": edited}).status_code == 200
    done = eventually(lambda: in_state(full, sid, tid, "completed"), deadline=30)
    assert done["tool_calls"][0]["arguments"] == edited
    assert done["tool_calls"][0]["proposed_arguments"] == args
    assert (Path(settings.sandbox_root) / sid / "out.txt").read_text() == "edited\n"


def test_a_rejected_call_never_runs_and_the_model_is_told_why(
    full: TestClient, settings: Settings
) -> None:
    sid = new_session(full, tools=["append_file"], approval_policy="side_effecting")
    args = {"path": "out.txt", "text": "no"}
    tid = submit(full, sid, f"/tool append_file {json.dumps(args)}")["turn_id"]
    call_id = _awaiting(full, sid, tid)["tool_calls"][0]["call_id"]

    response = full.post(
        f"/v1/sessions/{sid}/tool-calls/{call_id}/reject",
        json={"actor": "ops", "reason": "not this file"},
    )

    assert response.status_code == 200, response.text
    done = eventually(lambda: in_state(full, sid, tid, "completed", "failed"), deadline=30)
    assert done["tool_calls"][0]["state"] == "rejected"
    assert "rejected by operator: not this file" in done["reply"]
    assert not (Path(settings.sandbox_root) / sid / "out.txt").exists()


def test_approving_or_rejecting_a_call_that_is_not_proposed_is_409_and_writes_nothing(
    api: TestClient, runtime: Runtime
) -> None:
    sid = new_session(api)
    _, call_id = interrupt_a_turn(runtime, sid)  # an unknown call, not a proposed one
    before = version(api, sid)

    approve = api.post(f"/v1/sessions/{sid}/tool-calls/{call_id}/approve", json={"actor": "a"})
    reject = api.post(
        f"/v1/sessions/{sid}/tool-calls/{call_id}/reject", json={"actor": "a", "reason": "r"}
    )
    unknown = api.post(f"/v1/sessions/{sid}/tool-calls/nope/approve", json={"actor": "a"})

    problem(approve, 409, "call_not_proposed")
    problem(reject, 409, "call_not_proposed")
    problem(unknown, 404, "tool_call_not_found")
    assert version(api, sid) == before


def test_approving_or_rejecting_a_call_of_a_finished_turn_is_the_same_409(
    full: TestClient,
) -> None:
    sid = new_session(full, tools=["append_file"], approval_policy="all")
    tid = submit(full, sid, '/tool append_file {"path": "out.txt", "text": "x"}')["turn_id"]
    call_id = _awaiting(full, sid, tid)["tool_calls"][0]["call_id"]
    url = f"/v1/sessions/{sid}/tool-calls/{call_id}"
    assert full.post(f"{url}/reject", json={"actor": "a", "reason": "r"}).status_code == 200
    eventually(lambda: in_state(full, sid, tid, "completed", "failed"), deadline=30)
    before = version(full, sid)

    approve = full.post(f"{url}/approve", json={"actor": "a"})
    edit = {"actor": "a", "arguments": {"path": "o.txt", "text": ""}}
    edited = full.post(f"{url}/approve", json=edit)
    reject = full.post(f"{url}/reject", json={"actor": "a", "reason": "r"})

    for response in (approve, edited, reject):
        problem(response, 409, "call_not_proposed")
    assert version(full, sid) == before


def test_an_unknown_approval_policy_is_422(api: TestClient) -> None:
    problem(api.post("/v1/sessions", json={"approval_policy": "some"}), 422, "validation_error")


def test_cancelling_a_turn_awaiting_approval_cancels_its_proposed_call(
    full: TestClient,
) -> None:
    sid = new_session(full, tools=["append_file"], approval_policy="all")
    args = {"path": "out.txt", "text": "x"}
    tid = submit(full, sid, f"/tool append_file {json.dumps(args)}")["turn_id"]
    _awaiting(full, sid, tid)

    response = full.post(f"/v1/sessions/{sid}/turns/{tid}/cancel", json=CANCEL)

    assert response.json()["cancel"] == "cancelled"
    assert [c["state"] for c in response.json()["tool_calls"]] == ["cancelled"]


def test_an_approval_wait_past_its_deadline_is_cancelled(full: TestClient) -> None:
    sid = new_session(full, tools=["append_file"], approval_policy="all")
    args = {"path": "out.txt", "text": "x"}
    response = full.post(
        f"/v1/sessions/{sid}/turns",
        json={"message": f"/tool append_file {json.dumps(args)}", "deadline_seconds": 2},
    )
    tid = response.json()["turn_id"]

    done = eventually(lambda: in_state(full, sid, tid, "cancelled"), deadline=30)

    assert (done["reason"], done["actor"]) == ("deadline", "turnlog")
    assert UUID(sid)
