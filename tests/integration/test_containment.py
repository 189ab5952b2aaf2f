"""The hostile-tools ring: a ``shell`` call and a Python tool try to get out of the sandbox.

Each attempt — read /etc/shadow, /proc/1/environ, this server's environment or
another session's sandbox; write outside; connect to PostgreSQL's port or the
API's port on loopback; a fork bomb, 4 GB of memory, a 2 GB file, running past
the timeout, killing the parent — is refused or bounded, the call says why,
and the server (this test process) and other sessions go on unaffected.
The limits are small (tools file ``[sandbox.tools.*]``), so it stays fast.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from tests.conftest import ROOT, turnlog_env
from tests.integration.test_command_tools import call_tool, running, wait_until_none_runs
from turnlog.application.errors import ConfigurationError
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.application.tools.command import load_tools_file, shell_tool
from turnlog.application.tools.containment import Containment, check_host
from turnlog.interface.bootstrap import build_runtime, build_tools, contained

SECRET = "sk-hostile-ring-must-not-leak"

TOOLS = """
[sandbox]
cpu_seconds = 5
processes = 48
file_size_mb = 8
address_space_mb = 1024

[sandbox.tools.shell]
processes = 32
file_size_mb = 4
address_space_mb = 512

[[tools]]
name = "dial"
description = "Connect to a loopback port (granted the network)."
effect = "read_only"
command = ["python3", "-c", "{program}", "{port}"]
sandbox = { network = true }
[tools.parameters]
type = "object"
required = ["port"]
[tools.parameters.properties.port]
type = "integer"
[tools.parameters.properties.program]
type = "string"
"""
DIAL = "import socket, sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 2)"

HOSTILE = '''
import os, socket, time
import turnlog


@turnlog.tool(effect="side_effecting", timeout=4)
def attempt(action: str, target: str = "") -> str:
    """Try something a tool must not be able to do."""
    if action == "read":
        return open(target).read()
    if action == "list":
        return ",".join(sorted(os.listdir(target)))
    if action == "environment":
        return repr(dict(os.environ)) + open("/proc/1/environ").read()
    if action == "write":
        with open(target, "w") as handle:
            handle.write("escaped")
        return "written"
    if action == "connect":
        socket.create_connection(("127.0.0.1", int(target)), 2)
        return "connected"
    if action == "fork":
        children = 0
        try:
            while True:
                if os.fork() == 0:
                    time.sleep(30)
                    os._exit(0)
                children += 1
        except OSError as exc:
            raise RuntimeError(f"fork refused after {children} children: {exc}") from None
    if action == "allocate":
        return str(len(bytearray(4 << 30)))
    if action == "big_file":
        with open("big.bin", "wb") as handle:
            for _ in range(2048):
                handle.write(b"\\0" * (1 << 20))
        return "2 GB written"
    if action == "sleep":
        time.sleep(60)
    if action == "kill_parent":
        os.kill(os.getppid(), 9)
        os.kill(1, 9)
        return "still here"
    raise ValueError(action)
'''


@pytest.fixture
def hostile(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Runtime]:
    # Not a skip: a host that cannot sandbox must fail this ring (`make browser-deps`).
    assert check_host().ok, f"this host cannot sandbox: {check_host().reason}"
    monkeypatch.setenv("TURNLOG_OPENAI_API_KEY", SECRET)  # in this server's environment
    modules = tmp_path / "hostile_modules"
    modules.mkdir()
    (modules / "hostile_tools.py").write_text(HOSTILE)
    monkeypatch.syspath_prepend(str(modules))
    tools_file = tmp_path / "tools.toml"
    tools_file.write_text(TOOLS)
    rt = build_runtime(
        settings.model_copy(
            update={
                "shell_tool": True,
                "shell_timeout": 3.0,
                "tools_file": tools_file,
                "tool_modules": "hostile_tools",
            }
        )
    )
    yield rt
    rt.close()


def session(rt: Runtime) -> UUID:
    return rt.sessions.create_session(tools=rt.executor.tools.names()).session_id


def shell(rt: Runtime, sid: UUID, command: str) -> Any:
    return call_tool(rt, sid, "shell", {"command": command})


def python(rt: Runtime, sid: UUID, action: str, target: str = "") -> Any:
    return call_tool(rt, sid, "attempt", {"action": action, "target": target})


def refused(call: Any, *reasons: str) -> str:
    """The call failed, or its command exited non-zero; what it said names one of ``reasons``."""
    if call.state == "failed":
        said = call.error
    else:
        assert call.state == "succeeded" and call.result["exit_code"] != 0, call.result
        said = call.result["stderr"] + call.result["stdout"]
    assert any(r in said for r in reasons), said
    return str(said)


def leaks(text: str) -> bool:
    return SECRET in text or "postgresql://" in text or "TURNLOG_TEST" in text


def test_secrets_of_the_host_and_of_this_server_are_out_of_reach(hostile: Runtime) -> None:
    rt, sid = hostile, session(hostile)

    refused(shell(rt, sid, "cat /etc/shadow"), "Permission denied")
    refused(python(rt, sid, "read", "/etc/shadow"), "PermissionError")
    refused(shell(rt, sid, "cat /proc/1/environ"), "Permission denied")
    # This server's own process is not in the sandbox's pid namespace at all.
    own = f"/proc/{os.getpid()}/environ"
    said = refused(shell(rt, sid, f"env; cat {own}"), "No such file")
    assert not leaks(said)
    environment = python(rt, sid, "environment")
    assert not leaks(str(environment.error or environment.result))
    printed = shell(rt, sid, "env")
    assert printed.state == "succeeded" and not leaks(printed.result["stdout"])
    assert "TURNLOG_SESSION_ID" in printed.result["stdout"]


def test_another_sessions_sandbox_and_the_data_directory_are_invisible(
    hostile: Runtime,
) -> None:
    rt = hostile
    other, sid = session(rt), session(rt)
    written = call_tool(rt, other, "append_file", {"path": "secret.txt", "text": "theirs"})
    assert written.state == "succeeded"
    root = rt.settings.sandbox_root
    theirs = root / str(other) / "secret.txt"

    refused(shell(rt, sid, f"cat {theirs}"), "No such file")
    refused(python(rt, sid, "read", str(theirs)), "FileNotFoundError")
    listed = shell(rt, sid, f"ls -a {root} {rt.settings.data_dir}")
    assert str(other) not in listed.result["stdout"]
    assert python(rt, sid, "list", str(root)).result == str(sid)


def test_nothing_outside_the_sandbox_can_be_written(hostile: Runtime) -> None:
    rt, sid = hostile, session(hostile)
    places = [rt.settings.data_dir / "x", rt.settings.sandbox_root / "x", ROOT / "escaped.txt"]
    places += [Path("/tmp/turnlog-escaped.txt"), Path("/etc/escaped"), Path("/escaped")]

    for place in places:
        refused(
            shell(rt, sid, f"echo escaped > {place}"),
            "Read-only file system",
            "Permission denied",
            "Directory nonexistent",
        )
        refused(python(rt, sid, "write", str(place)), "OSError", "PermissionError")
        assert not place.exists(), place
    done = shell(rt, sid, "echo inside > mine.txt && cat mine.txt")
    assert done.result["stdout"] == "inside\n"
    assert (rt.settings.sandbox_root / str(sid) / "mine.txt").read_text() == "inside\n"


def test_loopback_services_are_unreachable_without_a_network_grant(hostile: Runtime) -> None:
    rt, sid = hostile, session(hostile)
    api = socket.create_server(("127.0.0.1", 0))  # stands for the API's port
    api.settimeout(0.2)
    port = api.getsockname()[1]
    try:
        for target in (5432, port):
            dial = f'python3 -c "{DIAL}" {target}'
            refused(shell(rt, sid, dial), "ConnectionRefusedError", "Network is unreachable")
            refused(python(rt, sid, "connect", str(target)), "ConnectionRefusedError")
        with pytest.raises(TimeoutError):
            api.accept()  # nothing ever reached it
        # A tool granted the network shares this host's: loopback included.
        granted = call_tool(rt, sid, "dial", {"port": port, "program": DIAL + "; print('in')"})
        assert granted.state == "succeeded" and granted.result["stdout"] == "in\n"
    finally:
        api.close()


def test_a_fork_bomb_is_bounded_and_other_sessions_go_on(hostile: Runtime) -> None:
    rt, sid, other = hostile, session(hostile), session(hostile)
    started = time.monotonic()

    bomb = shell(rt, sid, "b() { b | b & }; b; sleep 1; echo survived")
    refused(python(rt, sid, "fork"), "fork refused after", "BlockingIOError")

    assert bomb.state in ("failed", "succeeded")  # bounded: it ends, by itself or the timeout
    assert time.monotonic() - started < 60
    assert shell(rt, other, "echo fine").result["stdout"] == "fine\n"
    wait_until_none_runs("b | b")


def test_memory_file_size_time_and_the_parent_are_bounded(hostile: Runtime) -> None:
    rt, sid = hostile, session(hostile)
    sandbox = rt.settings.sandbox_root / str(sid)

    allocate = "python3 -c 'bytearray(4 << 30)'"
    refused(shell(rt, sid, allocate), "MemoryError")
    refused(python(rt, sid, "allocate"), "MemoryError")

    big = shell(rt, sid, "head -c 2G /dev/zero > big.bin")
    assert big.state == "failed" and "file size limit (file_size_mb = 4 MiB)" in big.error
    assert (sandbox / "big.bin").stat().st_size <= 4 << 20
    refused(python(rt, sid, "big_file"), "File too large")
    assert (sandbox / "big.bin").stat().st_size <= 8 << 20

    marker = f"60.{os.getpid()}"
    late = shell(rt, sid, f"sleep {marker}")
    assert late.state == "failed" and "timed out after 3s" in late.error
    refused(python(rt, sid, "sleep"), "timed out after 4s")
    assert not running(marker)

    parent = shell(rt, sid, "kill -9 $PPID 1; echo still here")
    assert "still here" in parent.result["stdout"]
    refused(python(rt, sid, "kill_parent"), "PermissionError")
    assert shell(rt, sid, "echo alive").result["stdout"] == "alive\n"


def test_the_tools_file_refuses_bad_sandbox_options_naming_the_tool(
    settings: Settings, tmp_path: Path
) -> None:
    cases = {
        "[sandbox.tools.shell]\nmemory = 5\n": "tool 'shell': unknown sandbox options ['memory']",
        "[sandbox.tools.shell]\ncpu_seconds = -1\n": "tool 'shell': cpu_seconds must be",
        "[sandbox]\nnetwork = true\n": "network is granted to one tool at a time",
        "[sandbox.tools.append_file]\nnetwork = true\n": "'append_file' runs inside turnlog",
        "[sandbox.tools.nothing]\nprocesses = 4\n": "'nothing' names no tool",
        textwrap.dedent(
            """
            [[tools]]
            name = "lister"
            description = "List."
            command = ["ls"]
            sandbox = { open_files = 0 }
            """
        ): "tool #1 ('lister'): open_files must be",
    }
    for text, expected in cases.items():
        tools_file = tmp_path / "tools.toml"
        tools_file.write_text(text)
        bad = settings.model_copy(update={"shell_tool": True, "tools_file": tools_file})
        with pytest.raises(ConfigurationError) as refused_:
            build_tools(bad)
        assert expected in str(refused_.value), (text, str(refused_.value))


def test_with_the_sandbox_off_a_tool_runs_unconfined(settings: Settings) -> None:
    rt = build_runtime(settings.model_copy(update={"shell_tool": True, "sandbox": "off"}))
    try:
        sid = session(rt)
        seen = shell(rt, sid, f"ls -d {rt.settings.data_dir}; id -u")
        assert seen.result["stdout"] == f"{rt.settings.data_dir}\n{os.geteuid()}\n"
    finally:
        rt.close()


def test_a_host_that_cannot_sandbox_gets_no_side_effecting_process_tools(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    missing = Containment(bwrap=str(tmp_path / "no-bwrap"))
    tools_file = tmp_path / "tools.toml"
    tools_file.write_text(TOOLS)
    declared = load_tools_file(tools_file, 1024, missing)
    offered = contained([shell_tool(5, 1024, containment=missing), *declared], missing)

    assert [t.spec.name for t in offered] == ["dial"]  # read_only: kept, unconfined
    assert all(not t.containment.enabled for t in offered)
    [warning] = [r.getMessage() for r in caplog.records if "no sandbox" in r.getMessage()]
    assert "no-bwrap not found" in warning and "left out: shell" in warning


def test_sandboxes_check_reports_what_the_sandbox_does_here(settings: Settings) -> None:
    def check(**env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "turnlog", "sandboxes", "check", "--json"],
            capture_output=True,
            text=True,
            env=turnlog_env(settings, **env),
            cwd=ROOT,
            timeout=60,
        )

    done = check()
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True and report["facts"]["uid"] != "0"
    facts = report["facts"]
    assert (facts["no_new_privs"], facts["capabilities"]) == ("1", "0000000000000000")
    assert (facts["interfaces"], facts["system_writable"], facts["others_visible"]) == (
        "lo",
        "no",
        "0",
    )
    off = check(TURNLOG_SANDBOX="off")
    assert off.returncode == 1 and json.loads(off.stdout)["ok"] is False


def test_a_command_whose_spawner_is_gone_never_runs_and_never_sees_its_lifeline(
    tmp_path: Path,
) -> None:
    # bwrap sets --die-with-parent in its child after cloning it: a spawner killed in
    # between leaves that child running. Its last step reads the lifeline first.
    assert check_host().ok, f"this host cannot sandbox: {check_host().reason}"
    sandbox = tmp_path / "sandboxes" / "lifeline" / "s"
    sandbox.mkdir(parents=True)

    def run(spawner_alive: bool) -> tuple[int, str]:
        lifeline, held = os.pipe()
        spawn = Containment().wrap(
            ["/bin/sh", "-c", "touch ran; ls /proc/$$/fd"],
            sandbox=sandbox,
            env={"PATH": "/usr/bin:/bin"},
            lifeline=lifeline,
        )
        if not spawner_alive:
            os.close(held)
        try:
            done = subprocess.run(
                spawn.argv,
                env=spawn.env,
                pass_fds=(lifeline,),
                capture_output=True,
                text=True,
                timeout=60,
            )
        finally:
            os.close(lifeline)
            if spawner_alive:
                os.close(held)
        return done.returncode, done.stdout

    assert run(spawner_alive=False) == (125, "")
    assert not (sandbox / "ran").exists()
    code, listed = run(spawner_alive=True)
    assert code == 0 and (sandbox / "ran").exists()
    assert listed.split() == ["0", "1", "2"]  # the lifeline is closed for the command
