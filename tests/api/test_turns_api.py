"""Turns over HTTP: submit, wait, conflicts, inspection and the operator's actions."""

from __future__ import annotations

import threading
import time
from uuid import UUID

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import APPEND, interrupt_a_turn, new_session, problem, run_queued_turn
from tests.deadlines import poll, scaled
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.application.store.logorder import Place
from turnlog.application.store.recorder import Hint
from turnlog.application.store.topics import WORK_MARK
from turnlog.domain.session import Session
from turnlog.domain.turns import Effect, ProbeAnswer
from turnlog.interface.bootstrap import build_runtime


def test_a_submitted_turn_is_stored_before_the_202_answer(
    api: TestClient, settings: Settings
) -> None:
    sid = new_session(api)

    response = api.post(f"/v1/sessions/{sid}/turns", json={"message": "hello"})

    assert response.status_code == 202
    body = response.json()
    assert body["state"] == "queued"
    assert body["session_id"] == sid
    assert body["message"] == "hello"
    assert body["position"] > 0
    assert response.headers["location"] == f"/v1/sessions/{sid}/turns/{body['turn_id']}"
    assert api.get(response.headers["location"]).json()["turn_id"] == body["turn_id"]
    # Another process (a fresh runtime) sees the queued turn in the log.
    other = build_runtime(settings)
    try:
        stored = other.sessions.get_session(UUID(sid)).turn(body["turn_id"])
        assert stored.state == "queued"
    finally:
        other.close()


def test_a_second_turn_while_one_is_queued_is_409_turn_in_progress(api: TestClient) -> None:
    sid = new_session(api)
    first = api.post(f"/v1/sessions/{sid}/turns", json={"message": "one"}).json()

    refused = problem(
        api.post(f"/v1/sessions/{sid}/turns", json={"message": "two"}), 409, "turn_in_progress"
    )
    assert refused["turn_id"] == first["turn_id"]


def test_a_repeated_turn_key_returns_the_original_turn_and_position(api: TestClient) -> None:
    sid = new_session(api)
    headers = {"Idempotency-Key": "turn-1"}
    first = api.post(f"/v1/sessions/{sid}/turns", json={"message": "hi"}, headers=headers)

    again = api.post(f"/v1/sessions/{sid}/turns", json={"message": "hi"}, headers=headers)

    assert again.status_code == 202
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["turn_id"] == first.json()["turn_id"]
    assert again.json()["position"] == first.json()["position"]
    problem(
        api.post(f"/v1/sessions/{sid}/turns", json={"message": "other"}, headers=headers),
        409,
        "idempotency_key_reused",
    )


def test_a_replayed_submit_with_wait_answers_its_finished_turn_at_once(
    api: TestClient, runtime: Runtime
) -> None:
    sid = new_session(api)
    headers = {"Idempotency-Key": "done-1"}
    api.post(f"/v1/sessions/{sid}/turns", json={"message": "hi"}, headers=headers)
    run_queued_turn(runtime, sid)  # finished before the repeat: no ending will come again

    started = time.monotonic()
    again = api.post(f"/v1/sessions/{sid}/turns?wait=60", json={"message": "hi"}, headers=headers)

    assert again.status_code == 200 and again.json()["state"] == "completed"
    assert again.headers["idempotent-replayed"] == "true"
    assert time.monotonic() - started < 60  # read at once, not after the wait ran out


def test_wait_returns_the_finished_turn_with_200(api: TestClient, runtime: Runtime) -> None:
    sid = new_session(api)
    worker = threading.Thread(target=_run_when_queued, args=(runtime, sid))
    worker.start()

    response = api.post(
        f"/v1/sessions/{sid}/turns?wait=30", json={"message": "The codeword is heron"}
    )
    worker.join()

    assert response.status_code == 200
    assert response.json()["state"] == "completed"
    assert response.json()["reply"] == "Noted. I will remember the codeword."


def test_a_wait_on_a_turn_this_process_ran_is_woken_by_the_save_that_ended_it(
    full: TestClient,
) -> None:
    state = full.app.state.turnlog  # type: ignore[attr-defined]
    follower, news = state.process.follower, state.process.runtime.sessions.news
    news.detach()  # only this process's own saves can wake it now
    try:
        sid = new_session(full)
        woken = state.waits.woken
        response = full.post(f"/v1/sessions/{sid}/turns?wait=10", json={"message": "hello"})
    finally:
        news.attach(follower)

    assert response.status_code == 200
    assert response.json()["state"] == "completed"
    assert state.waits.woken == woken + 1  # not read at the deadline: woken by the ending save


def test_a_wait_on_a_turn_another_process_ran_is_woken_by_the_hint_of_its_end(
    api: TestClient, runtime: Runtime
) -> None:
    # ``runtime`` is the other process here: its notifications come from its own pool.
    state = api.app.state.turnlog  # type: ignore[attr-defined]
    follower, news = state.process.follower, state.process.runtime.sessions.news
    follower.unsubscribe(news.page)  # no page can wake it: only the hint
    sid = new_session(api)
    answered: list[tuple[int, str]] = []

    def submit() -> None:
        response = api.post(f"/v1/sessions/{sid}/turns?wait=30", json={"message": "hello"})
        answered.append((response.status_code, response.json()["state"]))

    try:
        waiting = threading.Thread(target=submit)
        woken = state.waits.woken
        waiting.start()
        poll(lambda: state.waits.open == 1, scaled(10), "the wait to begin")
        poll(lambda: _queued(runtime, sid), scaled(10), "the submission")
        run_queued_turn(runtime, sid)  # the other process runs it and ends it
        waiting.join(scaled(30))
    finally:
        news.attach(follower)

    assert answered == [(200, "completed")]  # before the deadline
    assert state.waits.woken == woken + 1
    assert follower.hinted > 0


def _queued(runtime: Runtime, sid: str) -> bool:
    return runtime.sessions.get_session(UUID(sid)).open_turn is not None


def test_a_turn_submitted_here_is_offered_to_this_process_s_worker_once(
    full: TestClient,
) -> None:
    state = full.app.state.turnlog  # type: ignore[attr-defined]
    worker, follower, read = state.process.worker, state.process.follower, state.process.reads()
    news = state.process.runtime.sessions.news
    offered: list[str] = []
    offer = worker.offer
    worker.offer = lambda session_id: (offered.append(str(session_id)), offer(session_id))[1]
    # The follower's page is handed to the worker below, once the submit's save has
    # told the worker: the order it has unless the saving thread stalls for longer
    # than the follower waits and reads (then the session is offered twice).
    follower.unsubscribe(news.page)
    try:
        sid = new_session(full)
        response = full.post(f"/v1/sessions/{sid}/turns?wait=10", json={"message": "hello"})
        assert response.status_code == 200
        assert offered == [sid]  # at the submit's commit
        # Read once the commit horizon is past the submit (another client's open
        # transaction may hold it back for a moment).
        page = poll(
            lambda: (
                (p := read.events.read(Place.start(), 1000)).records
                and any(n.topic == Session.TurnSubmitted.TOPIC for _, n in p.records)
                and p
            ),
            20,
            "the submit below the horizon",
        )
        assert [n.topic for _, n in page.records].count(Session.TurnSubmitted.TOPIC) == 1
        news.page(page)  # the follower's page: the same submit again
    finally:
        news.attach(follower)
        del worker.offer
    assert offered == [sid]  # no second offer (it ran the session again after the turn)


@pytest.mark.parametrize("hint_first", [True, False], ids=["hint first", "page first"])
def test_work_hinted_by_another_process_is_offered_once_whatever_comes_first(
    full: TestClient, runtime: Runtime, hint_first: bool
) -> None:
    state = full.app.state.turnlog  # type: ignore[attr-defined]
    worker, follower, read = state.process.worker, state.process.follower, state.process.reads()
    news = state.process.runtime.sessions.news
    offered: list[str] = []
    worker.offer = lambda session_id: offered.append(str(session_id))  # told, not run
    news.detach()  # this test hands the news over itself
    try:
        sid = str(runtime.sessions.create_session(title="elsewhere").session_id)
        submitted = runtime.sessions.submit_turn(UUID(sid), "hello")  # another process's
        page = read.events.read(Place.start(), 1000)
        hints = [Hint(UUID(sid), WORK_MARK, submitted.version)]
        if hint_first:
            news.hints(hints)
            news.page(page)
        else:
            news.page(page)
            news.hints(hints)
    finally:
        news.attach(follower)
        del worker.offer
    assert offered == [sid]


def test_wait_answers_202_with_the_current_state_at_the_deadline(api: TestClient) -> None:
    sid = new_session(api)
    started = time.monotonic()

    response = api.post(f"/v1/sessions/{sid}/turns?wait=0.3", json={"message": "hi"})

    assert response.status_code == 202
    assert response.json()["state"] == "queued"
    assert response.headers["location"].endswith(f"/turns/{response.json()['turn_id']}")
    assert 0.3 <= time.monotonic() - started < scaled(5)


@pytest.mark.parametrize("wait", ["0", "-1", "61", "soon"])
def test_wait_outside_0_to_60_seconds_is_422(api: TestClient, wait: str) -> None:
    sid = new_session(api)
    problem(
        api.post(f"/v1/sessions/{sid}/turns?wait={wait}", json={"message": "hi"}),
        422,
        "validation_error",
    )


def test_bad_messages_are_422_and_oversized_bodies_413_without_a_write(
    api: TestClient, runtime: Runtime
) -> None:
    sid = new_session(api)
    url = f"/v1/sessions/{sid}/turns"

    problem(api.post(url, json={"message": "   "}), 422, "invalid_message")
    problem(api.post(url, json={"message": "x" * (64 * 1024 + 1)}), 422, "invalid_message")
    problem(api.post(url, json={}), 422, "validation_error")
    problem(api.post(url, json={"message": "x" * (1024 * 1024)}), 413, "payload_too_large")
    streamed = (b"x" * 65536 for _ in range(20))  # no Content-Length: counted as it arrives
    problem(
        api.post(url, content=streamed, headers={"content-type": "application/json"}),
        413,
        "payload_too_large",
    )
    assert runtime.sessions.get_session(UUID(sid)).version == 1


def test_an_unknown_session_or_turn_is_404(api: TestClient) -> None:
    sid = new_session(api)
    problem(
        api.post(f"/v1/sessions/{UUID(int=1)}/turns", json={"message": "hi"}),
        404,
        "session_not_found",
    )
    problem(api.get(f"/v1/sessions/{sid}/turns/nope"), 404, "turn_not_found")


def test_an_interrupted_turn_blocks_new_turns_listing_its_unknown_calls(
    api: TestClient, runtime: Runtime
) -> None:
    sid = new_session(api)
    turn_id, call_id = interrupt_a_turn(runtime, sid)

    refused = problem(
        api.post(f"/v1/sessions/{sid}/turns", json={"message": "next"}), 409, "unresolved_turn"
    )

    assert refused["turn_id"] == turn_id
    [unknown] = refused["unknown_calls"]
    assert unknown["call_id"] == call_id
    assert unknown["name"] == "append_file"
    assert unknown["arguments"] == APPEND
    assert unknown["started_at"]
    assert api.get(f"/v1/sessions/{sid}").json()["status"] == "blocked"


def test_inspecting_an_interrupted_turn_shows_calls_attempts_and_previous_worker(
    api: TestClient, runtime: Runtime
) -> None:
    sid = new_session(api)
    turn_id, call_id = interrupt_a_turn(runtime, sid)

    turn = api.get(f"/v1/sessions/{sid}/turns/{turn_id}").json()

    assert turn["state"] == "interrupted"
    assert turn["previous_worker"] == "gone:1:dead"
    assert turn["unknown_call_ids"] == [call_id]
    [call] = turn["tool_calls"]
    assert call["state"] == "unknown"
    assert call["arguments"] == APPEND
    assert call["attempt"] == 1
    assert call["effect"] == "side_effecting"
    assert call["worker_id"] == "gone:1:dead"
    assert call["started_at"]


def test_abandoning_an_interrupted_turn_unblocks_the_session(
    api: TestClient, runtime: Runtime
) -> None:
    sid = new_session(api)
    turn_id, _ = interrupt_a_turn(runtime, sid)
    url = f"/v1/sessions/{sid}/turns/{turn_id}/abandon"

    problem(api.post(url, json={"reason": " ", "actor": "ops"}), 422, "invalid_operator_action")
    abandoned = api.post(url, json={"reason": "cannot tell", "actor": "ops@example.com"})

    assert abandoned.status_code == 200
    body = abandoned.json()
    assert body["state"] == "abandoned"
    assert body["reason"] == "cannot tell" and body["actor"] == "ops@example.com"
    assert body["tool_calls"][0]["state"] == "abandoned"
    assert body["position"] > 0
    problem(api.post(url, json={"reason": "again", "actor": "ops"}), 409, "invalid_transition")
    assert api.post(f"/v1/sessions/{sid}/turns", json={"message": "next"}).status_code == 202


def test_abandoning_a_turn_that_is_not_interrupted_is_409(api: TestClient) -> None:
    sid = new_session(api)
    turn = api.post(f"/v1/sessions/{sid}/turns", json={"message": "hi"}).json()
    problem(
        api.post(
            f"/v1/sessions/{sid}/turns/{turn['turn_id']}/abandon",
            json={"reason": "r", "actor": "a"},
        ),
        409,
        "invalid_transition",
    )


def test_resolving_the_unknown_call_lets_the_turn_finish_with_the_recorded_result(
    api: TestClient, runtime: Runtime
) -> None:
    sid = new_session(api)
    turn_id, call_id = interrupt_a_turn(runtime, sid)
    url = f"/v1/sessions/{sid}/tool-calls/{call_id}/resolve"
    body = {"outcome": "succeeded", "result": {"bytes": 8}, "note": "file has it", "actor": "ops"}

    problem(api.post(url, json={**body, "outcome": "maybe"}), 422, "validation_error")
    resolved = api.post(url, json=body)

    assert resolved.status_code == 200
    assert resolved.json()["state"] == "running"
    assert resolved.json()["tool_calls"][0]["state"] == "resolved"
    problem(api.post(url, json=body), 409, "invalid_transition")
    problem(
        api.post(f"/v1/sessions/{sid}/tool-calls/nope/resolve", json=body),
        404,
        "tool_call_not_found",
    )
    run_queued_turn(runtime, sid)  # a worker continues the turn with the recorded result
    turn = api.get(f"/v1/sessions/{sid}/turns/{turn_id}").json()
    assert turn["state"] == "completed"
    assert turn["reply"].startswith('Tool append_file returned: {"bytes": 8}')


def _run_when_queued(runtime: Runtime, sid: str) -> None:
    deadline = time.monotonic() + scaled(20)
    while not runtime.sessions.get_session(UUID(sid)).turn_count:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    run_queued_turn(runtime, sid)


def test_the_unresolved_turn_refusal_carries_the_note_of_a_probe_that_could_not_tell(
    api: TestClient, runtime: Runtime
) -> None:
    sid = new_session(api)
    sessions = runtime.sessions
    turn_id = sessions.submit_turn(UUID(sid), "/tool append_file {}").turn_id
    claim, _ = sessions.update(UUID(sid), lambda s: s.claim_turn(turn_id, "gone:1:dead"))
    call = {"call_id": "c1", "name": "append_file", "arguments": APPEND}
    sessions.update(UUID(sid), lambda s: s.record_model_reply(turn_id, claim, "", [call]))
    sessions.update(
        UUID(sid),
        lambda s: s.start_tool_call(turn_id, claim, "c1", "gone:1:dead", Effect.SIDE_EFFECTING),
    )
    ours, _ = sessions.update(UUID(sid), lambda s: s.claim_turn(turn_id, "recoverer"))
    note = "the file changed, but not by exactly this line"

    def probed(s: Session) -> None:
        s.record_probe(turn_id, ours, "c1", ProbeAnswer.UNKNOWN, {}, note, 0.01, "recoverer")
        s.interrupt_turn(turn_id, "gone:1:dead", "recoverer")

    sessions.update(UUID(sid), probed)

    refused = problem(
        api.post(f"/v1/sessions/{sid}/turns", json={"message": "next"}), 409, "unresolved_turn"
    )

    [unknown] = refused["unknown_calls"]
    assert unknown["probe"] == {"answer": "unknown", "note": note}
