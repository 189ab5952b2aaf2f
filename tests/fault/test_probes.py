"""Outcome probes: a process SIGKILLed inside a side-effecting call, settled from evidence.

Real processes, real kills. Recovery (the next ``sessions send``, probes on)
asks the tool's probe instead of interrupting the turn; it never asks while
the process that ran the call may still be alive.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests import deadlines
from tests.conftest import ROOT, raw_events, turnlog_env
from tests.deadlines import scaled
from turnlog.application.settings import Settings, schema_name
from turnlog.application.store.database import Database
from turnlog.application.tools.processes import GATE_NAME

pytestmark = pytest.mark.fault

APPEND = '/tool append_file {{"path": "out.txt", "text": "written", "delay_seconds": {delay}}}'


def run(settings: Settings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "turnlog", *args],
        capture_output=True,
        text=True,
        env=turnlog_env(settings, **env),
        cwd=ROOT,
        timeout=scaled(90),
    )


def spawn(settings: Settings, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "turnlog", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=turnlog_env(settings, **env),
        cwd=ROOT,
    )


def count(database: Database, namespace: str, topic: str) -> int:
    topics = [r[3] for r in raw_events(database, namespace)]
    return topics.count(f"turnlog.session.{topic}.v1")


def wait_for(database: Database, namespace: str, topic: str, n: int = 1) -> None:
    deadlines.poll(lambda: count(database, namespace, topic) >= n, 60.0, f"{topic} recorded")


def new_session(settings: Settings, **env: str) -> str:
    done = run(settings, "sessions", "new", "--title", "probes", **env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def show(settings: Settings, session_id: str) -> dict[str, Any]:
    done = run(settings, "sessions", "show", session_id, "--json", "--all")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def first_turn(settings: Settings, session_id: str) -> dict[str, Any]:
    turns = show(settings, session_id)["turns"]
    return min(turns, key=lambda t: t["submitted_at"])  # type: ignore[no-any-return]


def past_the_gate(pid: int) -> None:
    """Wait until a recorded command runs: past turnlog's gate, whose argv is then gone.

    A worker killed before that closes the gate, and the command never starts.
    """
    cmdline = Path(f"/proc/{pid}/cmdline")
    deadlines.poll(lambda: GATE_NAME.encode() not in cmdline.read_bytes(), 20.0, "the command")


def kill(proc: subprocess.Popen[str]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=scaled(10))
    assert proc.returncode == -signal.SIGKILL


@contextmanager
def inserts_held(database: Database, namespace: str) -> Iterator[psycopg.Connection[Any]]:
    """Hold every insert into the namespace's log (readers still read) until the block ends.

    Before letting go, the backends still waiting on the lock are terminated:
    their client was killed meanwhile, and what it sent must not commit.
    """
    table = sql.Identifier(schema_name(namespace), "sessions_events")
    with psycopg.connect(database.conninfo) as conn:
        conn.execute(sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(table))
        try:
            yield conn
        finally:
            waiting = conn.execute(
                "SELECT pid FROM pg_locks WHERE NOT granted AND relation = %s::regclass",
                (f"{schema_name(namespace)}.sessions_events",),
            ).fetchall()
            for (pid,) in waiting:
                conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            conn.rollback()


def test_killed_before_the_write_the_probe_answers_not_applied_and_the_turn_continues(
    settings: Settings, database: Database
) -> None:
    session_id = new_session(settings)
    proc = spawn(settings, "sessions", "send", session_id, APPEND.format(delay=60))
    try:
        wait_for(database, settings.namespace, "ToolCallStarted")
    finally:
        kill(proc)

    done = run(settings, "sessions", "send", session_id, "after", TURNLOG_PROBES="1")
    assert done.returncode == 0, done.stderr
    assert "probe" in done.stderr
    assert done.stdout.strip() == "Echo: after"
    turn = first_turn(settings, session_id)
    call = turn["tool_calls"][0]
    assert turn["state"] == "completed"
    assert call["state"] == "resolved" and call["outcome"] == "failed"
    assert call["actor"] == "probe:append_file"
    assert call["result"] == "not applied (probe)"
    assert [p["answer"] for p in call["probes"]] == ["not_applied"]
    assert call["probes"][0]["evidence"]["now"] is None  # the file was never made
    assert "not applied (probe)" in turn["reply"]  # the model was told so
    assert not (settings.sandbox_root / session_id / "out.txt").exists()
    assert count(database, settings.namespace, "TurnInterrupted") == 0


def test_killed_after_the_write_the_probe_answers_applied_with_the_result(
    settings: Settings, database: Database
) -> None:
    session_id = new_session(settings)
    out = settings.sandbox_root / session_id / "out.txt"
    delay = deadlines.fault_window(3)  # the lock below is taken before the line lands
    proc = spawn(settings, "sessions", "send", session_id, APPEND.format(delay=delay))
    try:
        wait_for(database, settings.namespace, "ToolCallStarted")
        # The line lands while its result cannot be recorded: the process dies
        # between the side effect and the record of it.
        with inserts_held(database, settings.namespace):
            deadlines.poll(out.exists, 60.0, "the line written")
            kill(proc)
    finally:
        if proc.returncode is None:
            kill(proc)
    assert count(database, settings.namespace, "ToolCallSucceeded") == 0

    done = run(settings, "sessions", "send", session_id, "after", TURNLOG_PROBES="1")
    assert done.returncode == 0, done.stderr
    turn = first_turn(settings, session_id)
    call = turn["tool_calls"][0]
    assert turn["state"] == "completed"
    assert call["state"] == "resolved" and call["outcome"] == "succeeded"
    assert call["actor"] == "probe:append_file"
    assert call["result"] == {"path": "out.txt", "bytes": len("written\n")}
    assert call["probes"][0]["answer"] == "applied"
    assert call["evidence"]["recorded"]["exists"] is False
    assert turn["reply"].startswith('Tool append_file returned: {"bytes": 8, "path": "out.txt"}')
    assert out.read_text() == "written\n"  # exactly once


def _hanging_probe_tools(tmp_path: Path) -> Path:
    tools = tmp_path / "tools.json"
    tools.write_text(
        json.dumps(
            {
                "tools": [
                    {
                        "name": "charge",
                        "description": "Charge a card (slowly).",
                        "parameters": {"type": "object", "properties": {}},
                        "effect": "side_effecting",
                        "command": ["sleep", "120"],
                        "probe": ["sleep", "120"],
                        "probe_timeout_seconds": 1,
                    }
                ]
            }
        )
    )
    return tools


def test_a_probe_that_hangs_is_cut_at_its_timeout_and_the_turn_interrupted_with_the_note(
    settings: Settings, database: Database, tmp_path: Path
) -> None:
    # Unconfined: a sandboxed command dies with its worker, and this test needs one that
    # outlives it (tests/fault/test_tool_processes.py has the sandboxed case).
    env = {"TURNLOG_TOOLS_FILE": str(_hanging_probe_tools(tmp_path)), "TURNLOG_SANDBOX": "off"}
    session_id = new_session(settings, **env)
    proc = spawn(settings, "sessions", "send", session_id, "/tool charge {}", **env)
    try:
        wait_for(database, settings.namespace, "ToolCallProcessStarted")
        pid = first_turn(settings, session_id)["tool_calls"][0]["processes"][0]["pid"]
        past_the_gate(pid)
    finally:
        kill(proc)
    # The command outlived the worker: while it lives, no probe may run.
    blocked = run(settings, "sessions", "send", session_id, "after", TURNLOG_PROBES="1", **env)
    assert blocked.returncode == 3, blocked.stderr
    assert count(database, settings.namespace, "ToolCallProbed") == 0
    assert "still alive" in blocked.stderr
    turn = first_turn(settings, session_id)
    assert turn["state"] == "interrupted"

    # Same again, with the command's process group gone too: the probe runs and hangs.
    abandoned = run(
        settings, "turns", "abandon", session_id, turn["turn_id"], "--reason", "r", "--actor", "t"
    )
    assert abandoned.returncode == 0, abandoned.stderr
    os.killpg(pid, signal.SIGKILL)
    proc = spawn(settings, "sessions", "send", session_id, "/tool charge {}", **env)
    try:
        wait_for(database, settings.namespace, "ToolCallProcessStarted", 2)
        second = [t for t in show(settings, session_id)["turns"] if t["tool_calls"]][-1]
        pid = second["tool_calls"][0]["processes"][0]["pid"]
        past_the_gate(pid)
    finally:
        kill(proc)
    os.killpg(pid, signal.SIGKILL)
    hung = run(settings, "sessions", "send", session_id, "after", TURNLOG_PROBES="1", **env)
    assert hung.returncode == 3, hung.stderr
    turn = [t for t in show(settings, session_id)["turns"] if t["tool_calls"]][-1]
    probes = turn["tool_calls"][0]["probes"]
    assert turn["state"] == "interrupted"
    assert [p["answer"] for p in probes] == ["unknown"]
    assert probes[0]["note"] == "the probe timed out after 1s"
    assert probes[0]["duration_seconds"] >= 1.0


def test_no_probe_runs_while_the_owner_is_alive_but_stopped(
    settings: Settings, database: Database
) -> None:
    session_id = new_session(settings)
    proc = spawn(settings, "sessions", "send", session_id, APPEND.format(delay=60))
    try:
        wait_for(database, settings.namespace, "ToolCallStarted")
        os.kill(proc.pid, signal.SIGSTOP)
        refused = run(settings, "sessions", "send", session_id, "after", TURNLOG_PROBES="1")
        assert refused.returncode == 3, refused.stderr
        check = run(settings, "check", TURNLOG_PROBES="1")
        assert "left to a live owner" in check.stdout + check.stderr
        assert count(database, settings.namespace, "ToolCallProbed") == 0
        assert first_turn(settings, session_id)["state"] == "running"
    finally:
        kill(proc)
