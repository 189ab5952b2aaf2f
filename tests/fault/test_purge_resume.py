"""A purge SIGKILLed halfway, at each of its steps, finishes when it is asked again.

The purge runs in a real ``turnlog sessions purge`` process, told by
``TURNLOG_PURGE_PAUSE`` to stop after one step and wait there; the test kills
it with SIGKILL, looks at what the database holds, and runs the command
again.
"""

from __future__ import annotations

import json
import select
import signal
import subprocess
import sys
import time
from uuid import UUID

import psycopg
import pytest
from psycopg import sql

from tests import deadlines
from tests.conftest import ROOT, turnlog, turnlog_env
from tests.purge_support import needles_of, purge_record, traces
from turnlog.application.purge import STEPS
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings, schema_name
from turnlog.application.store.database import Database

pytestmark = [pytest.mark.fault, pytest.mark.timeout(240)]
TITLE = "killed-purge-title-3b1d"
SECRET = "killed-purge-secret-5e0a"
REASON = ("--reason", "erasure", "--actor", "dpo")


def _events(database: Database, namespace: str, sid: str) -> int:
    statement = sql.SQL("SELECT count(*) FROM {}.sessions_events WHERE originator_id = %s")
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        row = conn.execute(
            statement.format(sql.Identifier(schema_name(namespace))), (sid,)
        ).fetchone()
    return int(row[0]) if row else 0


def _paused_purge(settings: Settings, sid: str, step: str) -> subprocess.Popen[str]:
    """A purge process stopped after ``step``, once it says so on stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "turnlog", "sessions", "purge", sid, *REASON],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=turnlog_env(settings, TURNLOG_PURGE_PAUSE=step),
        cwd=ROOT,
    )
    assert proc.stderr is not None
    deadline = time.monotonic() + deadlines.scaled(60)
    said = ""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], 0.5)
        if ready:
            line = proc.stderr.readline()
            said += line
            if f"purge paused after {step}" in line:
                return proc
            if not line and proc.poll() is not None:
                break
    proc.kill()
    raise AssertionError(f"the purge never paused after {step}: {said}")


@pytest.mark.parametrize("step", STEPS)
def test_a_purge_killed_after_each_step_finishes_when_asked_again(
    runtime: Runtime, settings: Settings, database: Database, namespace: str, step: str
) -> None:
    sid = runtime.sessions.create_session(title=TITLE, metadata={"case": SECRET}).session_id
    for i in range(2):
        args = json.dumps({"path": "notes.txt", "text": f"{SECRET}-{i}"})
        runtime.send(sid, f"/tool append_file {args}")
    before = _events(database, namespace, str(sid))
    sandbox = settings.sandbox_root / str(sid)
    assert sandbox.is_dir()

    proc = _paused_purge(settings, str(sid), step)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    if proc.stdout is not None:
        proc.stdout.close()
    if proc.stderr is not None:
        proc.stderr.close()

    halfway = purge_record(database, namespace, str(sid))
    assert halfway is not None and halfway["state"] == "purging", halfway
    assert (halfway["reason"], halfway["actor"]) == ("erasure", "dpo")
    if step == "dropped":
        assert _events(database, namespace, str(sid)) == 0
        assert halfway["events"] == before + 1  # with the close
    else:
        assert halfway["events"] is None
        assert _events(database, namespace, str(sid)) >= before
    if step in ("sandbox", "dropped"):
        assert not sandbox.exists()

    again = turnlog(
        settings, "sessions", "purge", str(sid), "--reason", "erasure", "--actor", "dpo"
    )

    assert again.returncode == 0, again.stderr
    assert f"purged session {sid}" in again.stdout
    done = purge_record(database, namespace, str(sid))
    assert done is not None and done["state"] == "done" and done["completed_at"]
    assert done["events"] == before + 1 and done["head_version"] == before
    assert traces(database, namespace, needles_of(sid, TITLE, SECRET), skip=["purges"]) == {}
    assert not sandbox.exists()
    gone = turnlog(settings, "sessions", "show", str(sid))
    assert gone.returncode == 4 and "purged" in gone.stderr, gone.stderr
    twice = turnlog(settings, "sessions", "purge", str(sid), "--reason", "x", "--actor", "y")
    assert twice.returncode == 4 and "purged" in twice.stderr
    assert UUID(str(done["session_id"])) == sid
