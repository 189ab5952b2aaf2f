"""Execution ownership across process deaths: API, workers and projections as real processes."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deadlines import fault_window, scaled
from tests.fault.cluster import Cluster, cluster, poll, worker_pid
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database

pytestmark = pytest.mark.fault


@pytest.fixture
def running(settings: Settings, database: Database) -> Iterator[Cluster]:
    """A separate API, projection runner and first worker."""
    with cluster(settings, database) as c:
        c.api("api")
        c.projections()
        yield c


def holder(c: Cluster, session_id: str, turn_id: str) -> str:
    """The worker id that currently holds the turn (from its latest claim)."""
    return str(poll(lambda: c.turn(session_id, turn_id)["worker_id"], 20, "a claim"))


def test_the_worker_finishes_a_turn_while_the_api_process_is_killed(running: Cluster) -> None:
    c = running
    c.worker("w1")
    session_id = c.new_session()
    submitted = c.submit(session_id, '/tool sleep {"seconds": 2}')
    assert submitted.status_code == 202, submitted.text
    turn_id = submitted.json()["turn_id"]
    holder(c, session_id, turn_id)
    api = next(p for p in c.processes if p.name.startswith("api"))
    assert api.kill() == -signal.SIGKILL
    poll(lambda: "TurnCompleted" in c.topics(session_id), 30, "the turn completed")
    c.api("api")  # a new API process serves the finished turn
    turn = c.turn(session_id, turn_id)
    assert turn["state"] == "completed"
    assert turn["reply"] == 'Tool sleep returned: {"slept": 2.0}'


def test_a_second_worker_resumes_a_turn_whose_worker_died_during_a_model_step(
    running: Cluster,
) -> None:
    c = running
    workers = {p.pid: p for p in (c.worker("w1"), c.worker("w2"))}
    session_id = c.new_session()
    turn_id = c.submit(session_id, "/slow 5 hello").json()["turn_id"]
    owner = workers[worker_pid(holder(c, session_id, turn_id))]
    owner.kill()
    died = time.monotonic()
    poll(lambda: c.topics(session_id).count("TurnClaimed") == 2, 10, "a second claim")
    assert time.monotonic() - died < scaled(5.0)  # resumed within 5 s of the death (idle)
    poll(lambda: c.turn(session_id, turn_id)["state"] == "completed", 20, "completion")
    topics = c.topics(session_id)
    assert topics.count("TurnClaimed") == 2
    assert topics.count("ModelReplied") == 1  # one reply per recorded step
    assert c.turn(session_id, turn_id)["reply"] == "Echo: hello"


def append_call(path: str = "out.txt", delay: int = 60) -> str:
    # The call waits ``delay`` s before it writes: long enough that the kill lands in the
    # wait however busy the machine (it never runs out: its worker dies in it).
    return f'/tool append_file {{"path": "{path}", "text": "written", "delay_seconds": {delay}}}'


def kill_worker_mid_append(c: Cluster, settings: Settings) -> tuple[str, str, str]:
    # Both workers run before the turn is submitted: starting a process on a loaded
    # machine can outlast the call, which then finished before the kill.
    workers = {p.pid: p for p in (c.worker("w1"), c.worker("w2"))}
    session_id = c.new_session()
    turn_id = c.submit(session_id, append_call()).json()["turn_id"]
    poll(lambda: "ToolCallStarted" in c.topics(session_id), 20, "the call started")
    assert "ToolCallSucceeded" not in c.topics(session_id)  # still in flight at the kill
    workers[worker_pid(holder(c, session_id, turn_id))].kill()
    died = time.monotonic()
    turn = poll(
        lambda: (t := c.turn(session_id, turn_id))["state"] == "interrupted" and t,
        10,
        "interrupted",
    )
    assert time.monotonic() - died < scaled(5.0)  # interrupted within 5 s of the death (idle)
    call_id = turn["unknown_call_ids"][0]
    return session_id, turn_id, call_id


def sandbox(settings: Settings, session_id: str) -> Path:
    return settings.sandbox_root / session_id / "out.txt"


def test_a_worker_killed_during_a_side_effecting_call_leaves_the_turn_interrupted(
    running: Cluster, settings: Settings
) -> None:
    c = running
    session_id, turn_id, call_id = kill_worker_mid_append(c, settings)
    refused = c.submit(session_id, "hello")
    assert refused.status_code == 409
    problem = refused.json()
    assert problem["code"] == "unresolved_turn"
    assert [u["call_id"] for u in problem["unknown_calls"]] == [call_id]
    assert problem["unknown_calls"][0]["name"] == "append_file"
    assert not sandbox(settings, session_id).exists()  # no second execution

    abandoned = c.request(
        "POST",
        f"/v1/sessions/{session_id}/turns/{turn_id}/abandon",
        json={"reason": "checked the file", "actor": "ops"},
    )
    assert abandoned.status_code == 200, abandoned.text
    done = c.submit(session_id, "hello", wait=30)
    assert done.status_code == 200 and done.json()["reply"] == "Echo: hello"
    assert not sandbox(settings, session_id).exists()


def test_resolving_the_unknown_call_lets_a_worker_finish_the_original_turn(
    running: Cluster, settings: Settings
) -> None:
    c = running
    session_id, turn_id, call_id = kill_worker_mid_append(c, settings)
    resolved = c.request(
        "POST",
        f"/v1/sessions/{session_id}/tool-calls/{call_id}/resolve",
        json={
            "outcome": "succeeded",
            "result": {"written": False},
            "note": "file checked: no line",
            "actor": "ops",
        },
    )
    assert resolved.status_code == 200, resolved.text
    turn = poll(
        lambda: (t := c.turn(session_id, turn_id))["state"] == "completed" and t,
        20,
        "the turn resumed and completed",
    )
    assert turn["reply"].startswith('Tool append_file returned: {"written": false}')
    assert not sandbox(settings, session_id).exists()


def test_a_read_only_call_killed_mid_flight_is_run_again_by_another_worker(
    running: Cluster,
) -> None:
    c = running
    first = c.worker("w1")
    session_id = c.new_session()
    seconds = fault_window(3)  # the kill lands mid-call
    turn_id = c.submit(session_id, f'/tool sleep {{"seconds": {seconds}}}').json()["turn_id"]
    poll(lambda: "ToolCallStarted" in c.topics(session_id), 20, "the call started")
    assert worker_pid(holder(c, session_id, turn_id)) == first.pid
    first.kill()
    assert "ToolCallSucceeded" not in c.topics(session_id), "the call ended before the kill"
    c.worker("w2")
    turn = poll(
        lambda: (t := c.turn(session_id, turn_id))["state"] == "completed" and t, 30, "completion"
    )
    assert turn["tool_calls"][0]["attempt"] == 2
    assert c.topics(session_id).count("ToolCallStarted") == 2


def test_a_fenced_out_worker_writes_nothing_and_runs_no_further_tool_call(
    running: Cluster,
) -> None:
    c = running
    first = c.worker("w1")
    session_id = c.new_session()
    seconds = fault_window(2)  # stopped mid-call
    turn_id = c.submit(session_id, f'/tool sleep {{"seconds": {seconds}}}').json()["turn_id"]
    poll(lambda: "ToolCallStarted" in c.topics(session_id), 20, "the call started")
    stale_worker = holder(c, session_id, turn_id)
    first.signal(signal.SIGSTOP)
    assert "ToolCallSucceeded" not in c.topics(session_id), "the call ended before the stop"
    try:
        backend = poll(lambda: c.lease_backend(session_id), 10, "the lease connection")
        c.terminate_backend(backend)
        c.worker("w2")
        poll(lambda: c.turn(session_id, turn_id)["state"] == "completed", 30, "takeover")
        before = c.topics(session_id)
    finally:
        first.signal(signal.SIGCONT)
    # Give the resumed worker every chance to write: its sleep ends within `seconds`.
    poll(
        lambda: "stopped working on session" in first.output() or "lost" in first.output(),
        20,
        "the stale worker noticing it lost the turn",
    )
    assert c.topics(session_id) == before  # none of its writes landed
    turn = c.turn(session_id, turn_id)
    assert [call["attempt"] for call in turn["tool_calls"]] == [2]
    assert turn["worker_id"] != stale_worker


def test_sigterm_drains_a_worker_and_another_finishes_its_turn(running: Cluster) -> None:
    c = running
    first = c.worker("w1", "--drain-timeout", "20")
    session_id = c.new_session()
    turn_id = c.submit(session_id, '/tool sleep {"seconds": 2}').json()["turn_id"]
    poll(lambda: "ToolCallStarted" in c.topics(session_id), 20, "the call started")
    first.signal(signal.SIGTERM)
    assert first.wait(timeout=30) == 0
    # It finished the step in progress (the tool's result is recorded) and let go.
    assert "ToolCallSucceeded" in c.topics(session_id)
    c.worker("w2")
    turn = poll(
        lambda: (t := c.turn(session_id, turn_id))["state"] == "completed" and t,
        30,
        "completion by the second worker",
    )
    assert turn["tool_calls"][0]["attempt"] == 1
