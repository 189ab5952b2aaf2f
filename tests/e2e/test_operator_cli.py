"""What an operator reads on the command line is true and can be copied into the next command.

Real `turnlog` processes on a real PostgreSQL: the version, ids never cut,
`--json` on every listing, and `check` telling the truth whatever else runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any
from uuid import UUID

from tests.conftest import ROOT, raw_events, spawn_turnlog, turnlog
from tests.fault.cluster import Cluster, poll
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database
from turnlog.domain.turns import Effect


def test_version_prints_the_installed_version() -> None:
    from turnlog import __version__

    done = subprocess.run(
        [sys.executable, "-m", "turnlog", "--version"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"turnlog {__version__}"


# ---------------------------------------------------------------- check (1) and ids (7)

APPEND = '/tool append_file {"path": "out.txt", "text": "x", "delay_seconds": 60}'


def kill_mid_append(settings: Settings, database: Database) -> str:
    """A CLI-only session whose `send` was SIGKILLed inside append_file; returns its id."""
    created = turnlog(settings, "sessions", "new", "--title", "blocked")
    assert created.returncode == 0, created.stderr
    session_id = created.stdout.strip()
    proc = spawn_turnlog(settings, "sessions", "send", session_id, APPEND)
    try:
        poll(
            lambda: any(
                r[3].startswith("turnlog.session.ToolCallStarted")
                for r in raw_events(database, settings.namespace, UUID(session_id))
            ),
            30,
            "the call started",
        )
        # Inside append_file: its sandbox is made after the call's start is recorded.
        poll(lambda: (settings.sandbox_root / session_id).is_dir(), 30, "the call's sandbox")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    return session_id


def check_json(settings: Settings) -> dict[str, Any]:
    done = turnlog(settings, "check", "--json")
    document = json.loads(done.stdout)
    # 3 while an operator must act (a turn interrupted, or to be), else 0.
    waiting = {"interrupt", "leave: waiting for an operator", "leave: awaiting approval"}
    must_act = any(turn["decision"] in waiting for turn in document["open_turns"])
    assert done.returncode == (3 if must_act else 0), done.stderr
    return document  # type: ignore[no-any-return]


def test_check_lists_a_blocked_session_in_the_cli_only_flow_and_says_how_far_behind_it_was(
    settings: Settings, database: Database
) -> None:
    session_id = kill_mid_append(settings, database)

    before = check_json(settings)
    [turn] = before["open_turns"]
    assert turn["session_id"] == session_id and turn["decision"] == "interrupt"
    assert before["read_model"]["behind_events"] > 0  # nothing ran the read model
    assert before["read_model"]["by"] == "this process" and before["read_model"]["current"]

    refused = turnlog(settings, "sessions", "send", session_id, "next")
    assert refused.returncode == 3, refused.stderr  # this interrupts the turn

    text = turnlog(settings, "check")  # piped: no terminal, 80 columns by default
    assert text.returncode == 3, text.stderr  # an operator must act
    assert "an operator must act" in text.stdout
    assert "event(s) behind" in text.stdout and "caught up by this process" in text.stdout
    assert session_id in text.stdout, text.stdout  # whole, copyable
    assert turn["turn_id"] in text.stdout, text.stdout
    assert "waiting for an operator" in text.stdout
    assert "1 open turn: 1 waiting for an operator" in text.stdout


def test_check_is_true_in_a_split_deployment_with_or_without_its_runner(
    settings: Settings, database: Database
) -> None:
    cluster = Cluster(settings, database)
    try:
        cluster.projections()
        first = kill_mid_append(settings, database)
        document = check_json(settings)
        assert [t["session_id"] for t in document["open_turns"]] == [first]
        assert document["read_model"]["current"]
        by = document["read_model"]["by"]
        assert by == "" or by.startswith("its runner (turnlog-projection open_turns"), by
        for process in cluster.processes:
            process.signal(signal.SIGTERM)
            process.wait()
        # The runner is gone: what happens now is still found.
        second = kill_mid_append(settings, database)
        document = check_json(settings)
        assert {t["session_id"] for t in document["open_turns"]} == {first, second}
        assert document["read_model"]["by"] == "this process"
    finally:
        for process in cluster.processes:
            process.kill()


def test_listings_never_cut_ids_and_all_speak_json(settings: Settings, database: Database) -> None:
    session_id = kill_mid_append(settings, database)
    listed = turnlog(settings, "sessions", "list")
    assert listed.returncode == 0 and session_id in listed.stdout, listed.stdout
    assert "…" not in listed.stdout

    def as_json(*args: str) -> Any:
        done = turnlog(settings, *args, "--json")
        # check: 3, an operator must act (the turn killed mid-append is to be interrupted)
        assert done.returncode == (3 if args == ("check",) else 0), (args, done.stderr)
        return json.loads(done.stdout)

    assert as_json("sessions", "list")[0]["id"] == session_id
    assert as_json("sessions", "show", session_id)["session_id"] == session_id
    assert as_json("db", "status")["namespace"] == settings.namespace
    assert {r["name"] for r in as_json("projections", "status")} == {
        "sessions",
        "open_turns",
        "tool_calls",
    }
    assert session_id in {s["session_id"] for s in as_json("sandboxes", "list")}
    assert as_json("workers") == []
    assert as_json("check")["open_turns"][0]["session_id"] == session_id


def test_a_resolve_whose_continuation_a_live_worker_takes_succeeds(
    settings: Settings, runtime: Runtime
) -> None:
    """The lease is held by a live process (here, this one, as serve's worker holds it)."""
    sessions = runtime.sessions
    sid = sessions.create_session().session_id
    turn_id = sessions.submit_turn(sid, "/tool append_file").turn_id
    claim, _ = sessions.update(sid, lambda s: s.claim_turn(turn_id, "gone:1:dead"))
    call = {"call_id": "c1", "name": "append_file", "arguments": {"path": "f", "text": "x"}}
    sessions.update(sid, lambda s: s.record_model_reply(turn_id, claim, "", [call]))
    sessions.update(
        sid, lambda s: s.start_tool_call(turn_id, claim, "c1", "gone:1:dead", Effect.SIDE_EFFECTING)
    )
    sessions.update(sid, lambda s: s.interrupt_turn(turn_id, "gone:1:dead"))
    lease = runtime.leases.try_acquire(sid)
    assert lease is not None
    with lease:
        done = turnlog(
            settings, "turns", "resolve", str(sid), "c1",
            "--outcome", "succeeded", "--result", "{}", "--actor", "ops",
        )  # fmt: skip

    assert done.returncode == 0, done.stdout + done.stderr
    assert "resolved as succeeded" in done.stdout
    assert "continued by a live process" in done.stdout
    assert "error" not in done.stderr
    assert sessions.get_session(sid).call("c1").state == "resolved"
