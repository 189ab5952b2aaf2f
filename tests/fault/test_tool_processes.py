"""A worker SIGKILLed while its `shell` tool runs: the orphaned process and `sandboxes gc`.

In the sandbox (the default) the command dies with its worker (bwrap's
--die-with-parent), so no call goes on unseen. Unconfined
(TURNLOG_SANDBOX=off) the command outlives the worker (it leads its own
process group). Its pid and start time are on record, so after the turn is
interrupted an operator can see it; gc leaves it alone while the call's
outcome is unknown, and kills exactly that process group once the turn is
abandoned — never another session's, never a process that merely reuses the pid.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from tests import deadlines
from tests.conftest import ROOT, raw_events, turnlog_env
from tests.deadlines import scaled
from tests.integration.test_command_tools import running
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database
from turnlog.application.tools.processes import GATE_NAME, kill_group, proc_stat
from turnlog.domain.turns import ToolProcess
from turnlog.interface.bootstrap import build_runtime

pytestmark = pytest.mark.fault

# Outlives the test however slow the machine (a 30-s sleep ended mid-test under load):
# the test, or its `leftovers` fixture, kills it.
SLEEP = '/tool shell {"command": "sleep 3600"}'


@pytest.fixture
def shell_settings(settings: Settings) -> Settings:
    # Unconfined: only a command outside the sandbox can outlive its worker.
    return settings.model_copy(update={"shell_tool": True, "sandbox": "off"})


@pytest.fixture
def rt(shell_settings: Settings) -> Iterator[Runtime]:
    runtime = build_runtime(shell_settings)
    yield runtime
    runtime.close()


@pytest.fixture
def leftovers(rt: Runtime) -> Iterator[list[UUID]]:
    """Sessions whose recorded processes the test kills at the end, whatever happened."""
    sessions: list[UUID] = []
    yield sessions
    for session_id in sessions:
        for process in recorded_processes(rt, session_id):
            kill_group(process)


def turnlog(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "turnlog", *args],
        capture_output=True,
        text=True,
        env=turnlog_env(settings, TURNLOG_SHELL_TOOL="true", TURNLOG_SANDBOX=settings.sandbox),
        cwd=ROOT,
        timeout=60,
    )


def recorded_processes(rt: Runtime, session_id: UUID) -> list[ToolProcess]:
    session = rt.sessions.get_record(session_id)  # finished turns' calls too
    return [
        ToolProcess(p["pid"], p["process_started_at"], p["host"], p["boot_id"])
        for call in session.calls.values()
        for p in call.processes
    ]


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in a process group, from /proc."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in "ZX":
            members.append(int(stat.parent.name))
    return members


def runs_sleep(pgid: int) -> bool:
    """Whether a process of the group runs `sleep` (the command, past any wrapper)."""
    for pid in group_members(pgid):
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0]
        except OSError:
            continue
        if argv0.rsplit(b"/", 1)[-1] == b"sleep":
            return True
    return False


def poll(condition: Any, what: str, deadline: float = 20.0) -> None:
    deadlines.poll(condition, deadline, what, every=0.02)


def kill_worker_mid_sleep(
    settings: Settings, database: Database, rt: Runtime, session_id: UUID
) -> ToolProcess:
    """Run a long `sleep` in a `turnlog sessions send` process, SIGKILL that process mid-command."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "turnlog", "sessions", "send", str(session_id), SLEEP],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=turnlog_env(settings, TURNLOG_SHELL_TOOL="true", TURNLOG_SANDBOX=settings.sandbox),
        cwd=ROOT,
    )
    try:
        poll(
            lambda: any(
                r[3] == "turnlog.session.ToolCallProcessStarted.v1"
                for r in raw_events(database, settings.namespace, session_id)
            ),
            "the process record",
        )
        [process] = recorded_processes(rt, session_id)
        # Past the gate (its argv is gone), and the command itself runs: in the sandbox,
        # bwrap sets --die-with-parent in its child before it starts the command, and a
        # worker killed while bwrap sets up is another case (the record keeps the pid).
        cmdline = Path(f"/proc/{process.pid}/cmdline")
        poll(lambda: GATE_NAME.encode() not in cmdline.read_bytes(), "the command to start")
        poll(lambda: runs_sleep(process.pid), "the sleep to run")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=scaled(10))
    return process


def sandboxes(settings: Settings) -> dict[str, Any]:
    listed = turnlog(settings, "sandboxes", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    return {s["session_id"]: s for s in json.loads(listed.stdout)}


def gc(settings: Settings, *flags: str) -> list[dict[str, str]]:
    done = turnlog(settings, "sandboxes", "gc", "--json", *flags)
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout))


def test_a_sandboxed_command_dies_with_its_killed_worker(
    settings: Settings, database: Database
) -> None:
    sandboxed = settings.model_copy(update={"shell_tool": True})
    runtime = build_runtime(sandboxed)
    try:
        session_id = runtime.sessions.create_session(tools=["shell"]).session_id
        process = kill_worker_mid_sleep(sandboxed, database, runtime, session_id)
        poll(lambda: not group_members(process.pid), "the sandbox to die with its worker")
        refused = turnlog(sandboxed, "sessions", "send", str(session_id), "next")
        assert refused.returncode == 3, refused.stderr  # side-effecting: outcome unknown
        [call] = runtime.sessions.get_session(session_id).calls.values()
        assert call.state == "unknown"
    finally:
        runtime.close()


# A worker that runs one sandboxed command the way tools do (gate, record, lifeline),
# with many read-only paths: bwrap's child takes a while to mount them all.
SPAWNER = """
import sys
from pathlib import Path
from turnlog.application.tools.containment import Containment, Grant
from turnlog.application.tools.processes import run_contained
sandbox, marker, *paths = sys.argv[1:]
run_contained(
    Containment(), ["/bin/sh", "-c", "sleep " + marker], sandbox=Path(sandbox), grant=Grant(),
    env={"PATH": "/usr/bin:/bin"}, read_only=[Path(p) for p in paths], timeout=3600,
    output_limit=100, report=lambda process: None,
)
"""


def test_a_worker_killed_while_its_sandbox_is_set_up_leaves_nothing_running(
    tmp_path: Path,
) -> None:
    # bwrap's child asks to die with its parent only once set up: a worker killed before
    # then left the child, and then the command, running with nobody to stop them.
    sandbox = tmp_path / "sandboxes" / "setup" / "s"
    sandbox.mkdir(parents=True)
    paths = [tmp_path / "visible" / str(n) for n in range(400)]
    for path in paths:
        path.mkdir(parents=True)
    marker = f"3600.{os.getpid()}"
    worker = subprocess.Popen(
        [sys.executable, "-c", SPAWNER, str(sandbox), marker, *map(str, paths)], cwd=ROOT
    )
    try:
        bwrap, child = deadlines.poll(lambda: bwrap_and_child(worker.pid), 60, "bwrap", 0)
        os.kill(child, signal.SIGSTOP)  # held in its set-up: the window, held open
        try:
            poll(lambda: state(child) in "TZX", "bwrap's child to stop")
            assert not children(child), "caught too late: the child has started the command"
            worker.send_signal(signal.SIGKILL)
            worker.wait(timeout=scaled(10))
        finally:
            os.kill(child, signal.SIGCONT)
        poll(lambda: state(bwrap) in "ZX" and state(child) in "ZX", "the sandbox to end")
        assert not running(marker), "the command runs with nobody to record or stop it"
    finally:
        worker.kill()
        worker.wait()
        for pid in running(marker):
            os.kill(pid, signal.SIGKILL)


def state(pid: int) -> str:
    """A process's state letter; X once it is gone."""
    return (proc_stat(pid) or (0, "X"))[1]


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            found += [int(c) for c in task.read_text().split()]
    return found


def bwrap_and_child(worker: int) -> tuple[int, int] | None:
    """(the sandbox's outer bwrap, its child) under the worker, once there."""
    for gate in children(worker):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{gate}/comm").read_text().strip() == "bwrap":
                cloned = children(gate)
                if cloned:
                    return gate, cloned[0]
    return None


def test_an_orphaned_command_is_kept_until_its_turn_is_abandoned_then_its_group_is_killed(
    shell_settings: Settings, database: Database, rt: Runtime, leftovers: list[UUID]
) -> None:
    a = rt.sessions.create_session(tools=rt.executor.tools.names()).session_id
    b = rt.sessions.create_session(tools=rt.executor.tools.names()).session_id
    leftovers += [a, b]
    proc_a = kill_worker_mid_sleep(shell_settings, database, rt, a)
    proc_b = kill_worker_mid_sleep(shell_settings, database, rt, b)
    assert group_members(proc_a.pid) and group_members(proc_b.pid)  # outlived their worker

    for session_id in (a, b):  # the next send recovers: the call is unknown, the turn blocks
        refused = turnlog(shell_settings, "sessions", "send", str(session_id), "next")
        assert refused.returncode == 3, refused.stderr
        [call] = rt.sessions.get_session(session_id).calls.values()
        assert call.state == "unknown"

    listed = sandboxes(shell_settings)
    assert listed[str(a)]["status"] == listed[str(b)]["status"] == "blocked"
    [live] = listed[str(a)]["processes"]
    assert (live["pid"], live["orphaned"]) == (proc_a.pid, False)

    kept = gc(shell_settings)
    assert {x["action"] for x in kept} == {"kept"} and len(kept) == 2
    assert group_members(proc_a.pid) and group_members(proc_b.pid)

    turn_a = rt.sessions.get_session(a).turns[0].turn_id
    rt.abandon_turn(a, turn_a, "the sleep does no harm", "ops")

    dry = gc(shell_settings, "--dry-run")
    assert [(x["session_id"], x["action"]) for x in dry if x["action"] != "kept"] == [
        (str(a), "would kill")
    ]
    assert group_members(proc_a.pid)

    done = gc(shell_settings)
    assert [(x["session_id"], x["action"]) for x in done if x["action"] != "kept"] == [
        (str(a), "killed")
    ]
    poll(lambda: not group_members(proc_a.pid), "A's process group to die")
    assert group_members(proc_b.pid)  # another session's interrupted call: untouched
    root = shell_settings.sandbox_root
    assert (root / str(a)).is_dir() and (root / str(b)).is_dir()  # neither session is closed

    rt.sessions.close_session(a, "done", "ops")
    removed = gc(shell_settings)
    assert [(x["session_id"], x["action"]) for x in removed if x["action"] != "kept"] == [
        (str(a), "removed")
    ]
    assert not (root / str(a)).exists()
    assert (root / str(b)).is_dir() and group_members(proc_b.pid)
