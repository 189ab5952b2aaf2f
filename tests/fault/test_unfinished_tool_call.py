"""A process SIGKILLed inside a tool call: the record must not lie about it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests import deadlines
from tests.conftest import raw_events, spawn_turnlog, turnlog
from tests.deadlines import scaled
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database

pytestmark = pytest.mark.fault


def wait_for_topic(
    database: Database, namespace: str, topic: str, count: int = 1, deadline: float = 30.0
) -> None:
    """Poll the events table until ``count`` events of ``topic`` are stored."""

    def stored() -> bool:
        topics = [r[3] for r in raw_events(database, namespace)]
        return topics.count(f"turnlog.session.{topic}.v1") >= count

    deadlines.poll(stored, deadline, f"{topic} recorded")


def kill_mid_tool(
    settings: Settings,
    database: Database,
    session_id: str,
    tool_call: str,
    topic: str = "ToolCallStarted",
) -> None:
    """Send a message in a new process; SIGKILL it once ``topic`` is stored (the call started)."""
    proc = spawn_turnlog(settings, "sessions", "send", session_id, tool_call)
    try:
        wait_for_topic(database, settings.namespace, topic)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=scaled(10))
    assert proc.returncode == -signal.SIGKILL


def new_session(settings: Settings) -> str:
    done = turnlog(settings, "sessions", "new", "--title", "fault")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def show(settings: Settings, session_id: str) -> dict:  # type: ignore[type-arg]
    done = turnlog(settings, "sessions", "show", session_id, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


APPEND = '/tool append_file {"path": "out.txt", "text": "written", "delay_seconds": 30}'


def sandbox_file(settings: Settings, session_id: str) -> Path:
    return settings.sandbox_root / session_id / "out.txt"


def test_a_side_effecting_call_killed_mid_flight_blocks_the_session_until_abandoned(
    settings: Settings, database: Database
) -> None:
    session_id = new_session(settings)
    kill_mid_tool(settings, database, session_id, APPEND)

    refused = turnlog(settings, "sessions", "send", session_id, "hello again")
    assert refused.returncode == 3, refused.stderr
    view = show(settings, session_id)
    turn = view["turns"][0]
    call_id = turn["tool_calls"][0]["call_id"]
    assert turn["state"] == "interrupted"
    assert turn["tool_calls"][0]["state"] == "unknown"
    assert call_id in refused.stderr and "append_file" in refused.stderr
    assert view["status"] == "blocked"
    # Refused again, by the rule this time, still naming the call.
    again = turnlog(settings, "sessions", "send", session_id, "hello again")
    assert again.returncode == 3 and "unresolved_turn" in again.stderr and call_id in again.stderr

    abandoned = turnlog(
        settings,
        "turns",
        "abandon",
        session_id,
        turn["turn_id"],
        "--reason",
        "checked: nothing written",
        "--actor",
        "ops",
    )
    assert abandoned.returncode == 0, abandoned.stderr
    accepted = turnlog(settings, "sessions", "send", session_id, "hello again")
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout.strip() == "Echo: hello again"
    assert not sandbox_file(settings, session_id).exists()  # never run a second time
    view = show(settings, session_id)
    assert view["turns"][0]["state"] == "abandoned"
    assert view["turns"][0]["tool_calls"][0]["state"] == "abandoned"


def test_resolving_the_unknown_call_lets_the_turn_continue_with_the_recorded_outcome(
    settings: Settings, database: Database
) -> None:
    session_id = new_session(settings)
    kill_mid_tool(settings, database, session_id, APPEND)
    refused = turnlog(settings, "sessions", "send", session_id, "next")
    assert refused.returncode == 3
    call_id = show(settings, session_id)["turns"][0]["tool_calls"][0]["call_id"]

    resolved = turnlog(
        settings,
        "turns",
        "resolve",
        session_id,
        call_id,
        "--outcome",
        "succeeded",
        "--result",
        '{"path": "out.txt", "checked": true}',
        "--note",
        "looked at the file by hand",
        "--actor",
        "ops",
    )
    assert resolved.returncode == 0, resolved.stderr + resolved.stdout
    assert "completed" in resolved.stdout
    turn = show(settings, session_id)["turns"][0]
    assert turn["state"] == "completed"
    assert turn["reply"].startswith('Tool append_file returned: {"checked": true')
    assert turn["tool_calls"][0]["state"] == "resolved"
    assert turn["tool_calls"][0]["actor"] == "ops"
    assert not sandbox_file(settings, session_id).exists()


def test_a_read_only_call_killed_mid_flight_is_run_again(
    settings: Settings, database: Database
) -> None:
    session_id = new_session(settings)
    kill_mid_tool(settings, database, session_id, '/tool sleep {"seconds": 30}')
    # The next process recovers: the sleep is read_only, so it runs again under
    # the same call id as attempt 2 (killed as well, once that is on record).
    proc = spawn_turnlog(settings, "sessions", "send", session_id, "after")
    try:
        wait_for_topic(database, settings.namespace, "ToolCallStarted", count=2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=scaled(10))
    view = show(settings, session_id)
    call = view["turns"][0]["tool_calls"][0]
    assert call["state"] == "started" and call["attempt"] == 2
    assert view["turns"][0]["state"] == "running"


def test_a_read_only_call_rerun_completes_the_turn(settings: Settings, database: Database) -> None:
    session_id = new_session(settings)
    seconds = deadlines.fault_window(3)
    kill_mid_tool(settings, database, session_id, f'/tool sleep {{"seconds": {seconds}}}')
    stored = [r[3] for r in raw_events(database, settings.namespace)]
    assert "turnlog.session.ToolCallSucceeded.v1" not in stored, "the call ended before the kill"
    done = turnlog(settings, "sessions", "send", session_id, "after")
    assert done.returncode == 0, done.stderr
    assert "re-run" in done.stderr
    assert done.stdout.strip() == "Echo: after"
    first = show(settings, session_id)["turns"][0]
    assert first["state"] == "completed"
    assert first["tool_calls"][0]["attempt"] == 2
    assert first["reply"] == f'Tool sleep returned: {{"slept": {float(seconds)}}}'


def test_unknown_session_and_bad_messages_are_refused_with_clear_errors(
    settings: Settings, database: Database
) -> None:
    session_id = new_session(settings)
    before = raw_events(database, settings.namespace)
    missing = turnlog(settings, "sessions", "send", "00000000-0000-0000-0000-000000000000", "hi")
    assert missing.returncode == 4 and "not found" in missing.stderr
    empty = turnlog(settings, "sessions", "send", session_id, "  ")
    assert empty.returncode == 2 and "must not be empty" in empty.stderr
    garbage = turnlog(settings, "sessions", "show", "not-a-uuid")
    assert garbage.returncode == 4
    bad_ns = subprocess.run(
        [*_cmd(), "--namespace", "Bad-Name", "sessions", "new"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad_ns.returncode == 2 and "invalid namespace" in bad_ns.stderr
    assert raw_events(database, settings.namespace) == before


def _cmd() -> list[str]:
    import sys

    return [sys.executable, "-m", "turnlog"]
