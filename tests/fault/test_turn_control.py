"""Cancel, deadlines and approval with real processes: API, projections and workers.

A cancel reaches the worker running the turn while its tool runs (the worker
polls its session's version); a stopped command's process group is gone; a
side-effecting call is left to finish unless the cancel is forced; approvals
and deadlines are in the record, so they outlive the worker process.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from tests.deadlines import fault_window, scaled
from tests.fault.cluster import Cluster, cluster, poll
from tests.fault.test_tool_processes import group_members, recorded_processes
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database
from turnlog.interface.bootstrap import build_runtime

pytestmark = pytest.mark.fault

TOOLS = {
    "tools": [
        {
            "name": "pause",
            "description": "Wait in a child process.",
            "parameters": {
                "type": "object",
                "properties": {"seconds": {"type": "integer"}},
                "required": ["seconds"],
            },
            "effect": "read_only",
            "command": ["sleep", "{seconds}"],
            "timeout_seconds": 120,
        }
    ]
}


@pytest.fixture
def running(settings: Settings, database: Database, tmp_path: Path) -> Iterator[Cluster]:
    tools_file = tmp_path / "tools.json"
    tools_file.write_text(json.dumps(TOOLS))
    env = {"TURNLOG_TOOLS_FILE": str(tools_file)}
    with cluster(settings, database) as c:
        c.api("api", **env)
        c.projections()
        c.env = env  # type: ignore[attr-defined]
        yield c


def new_session(c: Cluster, **body: Any) -> str:
    response = c.request("POST", "/v1/sessions", json={"title": "control", **body})
    assert response.status_code == 201, response.text
    return str(response.json()["session_id"])


def cancel(c: Cluster, sid: str, tid: str, force: bool = False) -> dict[str, Any]:
    response = c.request(
        "POST",
        f"/v1/sessions/{sid}/turns/{tid}/cancel",
        json={"reason": "stop it", "actor": "ops", "force": force},
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


def state_is(c: Cluster, sid: str, tid: str, *states: str) -> dict[str, Any] | None:
    turn = c.turn(sid, tid)
    return turn if turn["state"] in states else None


def append_call(delay: int) -> str:
    args = {"path": "out.txt", "text": "written", "delay_seconds": delay}
    return f"/tool append_file {json.dumps(args)}"


def test_cancelling_a_running_command_kills_its_process_group_within_two_seconds(
    running: Cluster, settings: Settings
) -> None:
    c = running
    c.worker("w1", **c.env)  # type: ignore[attr-defined]
    sid = new_session(c, tools=["pause"])
    tid = c.submit(sid, '/tool pause {"seconds": 30}').json()["turn_id"]
    poll(lambda: "ToolCallProcessStarted" in c.topics(sid), 30, "the command recorded")
    reader = build_runtime(settings)
    try:
        [process] = recorded_processes(reader, UUID(sid))
    finally:
        reader.close()
    pid = process.pid
    poll(lambda: group_members(pid), 10, "the command running")

    asked = time.monotonic()
    assert cancel(c, sid, tid)["cancel"] == "requested"
    done = poll(lambda: state_is(c, sid, tid, "cancelled", "completed"), 30, "cancelled")
    took = time.monotonic() - asked

    print(f"\ncancel → cancelled, group killed: {took:.2f} s (bound {scaled(2.0):.1f} s)")
    assert done["state"] == "cancelled", done
    assert took < scaled(2.0), took
    assert done["tool_calls"][0]["state"] == "cancelled"
    poll(lambda: not group_members(pid), 5, "the sleep's group gone")


def test_cancelling_during_a_side_effecting_write_lets_it_finish_once_then_stops(
    running: Cluster, settings: Settings
) -> None:
    c = running
    c.worker("w1", **c.env)  # type: ignore[attr-defined]
    sid = new_session(c, tools=["append_file"])
    delay = fault_window(3)  # the cancel lands mid-write
    tid = c.submit(sid, append_call(delay=delay)).json()["turn_id"]
    poll(lambda: "ToolCallStarted" in c.topics(sid), 30, "the call started")

    asked = time.monotonic()
    assert cancel(c, sid, tid)["cancel"] == "requested"
    done = poll(lambda: state_is(c, sid, tid, "cancelled", "completed"), 60, "the turn stopped")
    lines = (settings.sandbox_root / sid / "out.txt").read_text().count("\n")
    took = time.monotonic() - asked
    print(f"\ncancel in a {delay} s write → stopped in {took:.2f} s, {lines} line")

    assert done["state"] == "cancelled"
    assert done["tool_calls"][0]["state"] == "succeeded"  # its result is on record
    assert (settings.sandbox_root / sid / "out.txt").read_text() == "written\n"  # once
    topics = c.topics(sid)
    assert topics.count("ModelReplied") == 1  # no model call after the cancel
    assert topics[-1] == "TurnCancelled"


def test_a_forced_cancel_kills_a_side_effecting_call_and_interrupts_the_turn(
    running: Cluster, settings: Settings
) -> None:
    c = running
    c.worker("w1", **c.env)  # type: ignore[attr-defined]
    sid = new_session(c, tools=["append_file"])
    tid = c.submit(sid, append_call(delay=60)).json()["turn_id"]
    poll(lambda: "ToolCallStarted" in c.topics(sid), 30, "the call started")

    asked = time.monotonic()
    cancel(c, sid, tid, force=True)
    done = poll(lambda: state_is(c, sid, tid, "interrupted"), 30, "interrupted")
    print(f"\nforced cancel of a 60 s write → interrupted after {time.monotonic() - asked:.2f} s")

    assert done["tool_calls"][0]["state"] == "unknown"
    refused = c.submit(sid, "hello")
    assert refused.status_code == 409 and refused.json()["code"] == "unresolved_turn"


def test_an_approval_survives_the_worker_being_killed_while_the_turn_waits(
    running: Cluster, settings: Settings
) -> None:
    c = running
    first = c.worker("w1", **c.env)  # type: ignore[attr-defined]
    sid = new_session(c, tools=["append_file"], approval_policy="side_effecting")
    tid = c.submit(sid, append_call(delay=0)).json()["turn_id"]
    waiting = poll(lambda: state_is(c, sid, tid, "awaiting_approval"), 30, "awaiting approval")
    first.kill()

    c.worker("w2", **c.env)  # type: ignore[attr-defined]
    call_id = waiting["tool_calls"][0]["call_id"]
    approved = c.request(
        "POST", f"/v1/sessions/{sid}/tool-calls/{call_id}/approve", json={"actor": "ops"}
    )

    assert approved.status_code == 200, approved.text
    asked = time.monotonic()
    done = poll(lambda: state_is(c, sid, tid, "completed", "failed"), 60, "completed")
    print(f"\napproval after the waiter's SIGKILL → completed in {time.monotonic() - asked:.2f} s")
    assert done["state"] == "completed"
    assert (settings.sandbox_root / sid / "out.txt").read_text() == "written\n"


def test_a_deadline_that_passes_while_no_worker_runs_is_enforced_by_the_next_worker(
    running: Cluster,
) -> None:
    c = running
    sid = new_session(c)
    response = c.request(
        "POST",
        f"/v1/sessions/{sid}/turns",
        json={"message": "hello", "deadline_seconds": 1},
    )
    assert response.status_code == 202, response.text
    tid = response.json()["turn_id"]
    deadline = datetime.fromisoformat(response.json()["deadline_at"])
    # No worker exists: the deadline passes with the turn still queued.
    poll(lambda: datetime.now(UTC) > deadline, 10, "the deadline to pass")
    assert c.turn(sid, tid)["state"] == "queued"

    started = time.monotonic()
    c.worker("w1", **c.env)  # type: ignore[attr-defined]
    done = poll(lambda: state_is(c, sid, tid, "cancelled", "completed"), 60, "cancelled")
    print(
        f"\nexpired deadline → cancelled {time.monotonic() - started:.2f} s after a worker started"
    )

    assert (done["state"], done["reason"], done["actor"]) == ("cancelled", "deadline", "turnlog")
