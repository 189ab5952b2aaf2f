"""Command tools (``shell`` and tools declared in a file) run as real processes in the sandbox.

The fixture provider calls them (``/tool NAME {json}``) through the agent loop,
so each test also shows what is recorded around a spawned process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from tests.conftest import ROOT, raw_events, turnlog_env
from tests.deadlines import scaled
from turnlog.application.errors import ConfigurationError, LeaseLost
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database
from turnlog.application.tools.command import load_tools_file
from turnlog.application.tools.processes import (
    identify,
    is_alive,
    kill_group,
    proc_stat,
    run_command,
)
from turnlog.domain import errors as domain_errors
from turnlog.domain.session import Session
from turnlog.domain.turns import Effect, ToolProcess
from turnlog.interface.bootstrap import build_runtime, build_tools

TOOLS_TOML = """
[[tools]]
name = "greet"
description = "Greet someone, optionally several times."
effect = "read_only"
command = ["printf", "%s|%s|", "{name}", "--times={times}"]
timeout_seconds = 5

[tools.parameters]
type = "object"
required = ["name"]
additionalProperties = false

[tools.parameters.properties.name]
type = "string"

[tools.parameters.properties.times]
type = "integer"
"""


@pytest.fixture
def shell_runtime(settings: Settings) -> Iterator[Runtime]:
    rt = build_runtime(
        settings.model_copy(
            update={"shell_tool": True, "shell_timeout": 1.0, "tool_output_bytes": 256}
        )
    )
    yield rt
    rt.close()


def new_session(rt: Runtime) -> UUID:
    return rt.sessions.create_session(tools=rt.executor.tools.names()).session_id


def call_tool(rt: Runtime, session_id: UUID, name: str, arguments: dict[str, Any]) -> Any:
    """Run ``/tool NAME {json}``; the finished turn's only tool call, as the session has it."""
    turn = rt.send(session_id, f"/tool {name} {json.dumps(arguments)}").turn
    session, recorded = rt.sessions.turn_record(session_id, turn.turn_id)
    [call] = session.calls_of(recorded)
    return call


def gone(pid: int) -> bool:
    stat = proc_stat(pid)
    return stat is None or stat[1] in "ZX"


def running(marker: str) -> list[int]:
    """Host pids whose command line holds ``marker`` (a pid printed inside a sandbox is its
    pid namespace's, meaningless here)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and not gone(int(entry.name)):
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def wait_until_none_runs(marker: str, deadline: float = 10.0) -> None:
    end = time.monotonic() + scaled(deadline)
    while running(marker):
        assert time.monotonic() < end, f"{running(marker)} still run {marker!r}"
        time.sleep(0.02)


def wait_until_gone(pid: int, deadline: float = 10.0) -> None:
    end = time.monotonic() + scaled(deadline)
    while not gone(pid):
        assert time.monotonic() < end, f"process {pid} still alive"
        time.sleep(0.02)


# ---------------------------------------------------------------- shell


def test_the_shell_tool_is_offered_only_when_enabled(runtime: Runtime, settings: Settings) -> None:
    assert "shell" not in runtime.executor.tools.names()
    session_id = new_session(runtime)
    turn = runtime.send(session_id, '/tool shell {"command": "touch x"}').turn
    assert turn.state == "failed" and "unknown tool 'shell'" in turn.error
    assert not (settings.sandbox_root / str(session_id) / "x").exists()


def test_a_shell_command_runs_in_the_sandbox_after_its_process_is_on_record(
    shell_runtime: Runtime, database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TURNLOG_OPENAI_API_KEY", "sk-must-not-leak")
    rt = shell_runtime
    session_id = new_session(rt)
    sandbox = rt.settings.sandbox_root / str(session_id)
    command = 'pwd; echo made > made.txt; echo "$TURNLOG_CALL_ID ${TURNLOG_OPENAI_API_KEY:-unset}"'

    call = call_tool(rt, session_id, "shell", {"command": command})

    assert call.state == "succeeded" and call.effect == Effect.SIDE_EFFECTING
    assert call.result["exit_code"] == 0
    assert call.result["stdout"].splitlines() == [str(sandbox), f"{call.call_id} unset"]
    assert (sandbox / "made.txt").read_text() == "made\n"
    [process] = call.processes
    assert process["attempt"] == 1 and process["pid"] > 0 and process["process_started_at"] > 0
    topics = [r[3] for r in raw_events(database, rt.settings.namespace, session_id)]
    started = topics.index("turnlog.session.ToolCallStarted.v1")
    assert topics[started : started + 3] == [
        "turnlog.session.ToolCallStarted.v1",
        "turnlog.session.ToolCallProcessStarted.v1",  # before the command did anything
        "turnlog.session.ToolCallSucceeded.v1",
    ]


def test_output_beyond_the_limit_is_truncated(
    shell_runtime: Runtime,
) -> None:
    rt = shell_runtime
    session_id = new_session(rt)
    call = call_tool(rt, session_id, "shell", {"command": "head -c 5000 /dev/zero | tr '\\0' a"})
    assert call.result["stdout"] == "a" * 256 and call.result["truncated"] is True
    assert call.result["exit_code"] == 0


def test_a_command_that_outlives_its_timeout_fails_and_its_process_group_is_killed(
    shell_runtime: Runtime,
) -> None:
    rt = shell_runtime
    session_id = new_session(rt)
    sandbox = rt.settings.sandbox_root / str(session_id)

    marker = f"30.{os.getpid()}{time.monotonic_ns() % 10**6}"
    command = f"sleep {marker} & echo started > bg.txt; wait"

    call = call_tool(rt, session_id, "shell", {"command": command})

    assert call.state == "failed" and "timed out after 1s" in call.error
    assert (sandbox / "bg.txt").read_text() == "started\n"
    wait_until_none_runs(marker)


def test_what_a_finished_command_leaves_running_in_its_group_is_killed(
    shell_runtime: Runtime,
) -> None:
    rt = shell_runtime
    marker = f"30.{os.getpid()}{time.monotonic_ns() % 10**6}"
    call = call_tool(rt, new_session(rt), "shell", {"command": f"sleep {marker} & echo $!"})
    assert call.state == "succeeded"
    wait_until_none_runs(marker)


def test_a_command_whose_process_cannot_be_recorded_never_runs(tmp_path: Path) -> None:
    reported: list[ToolProcess] = []

    def refuse(process: ToolProcess) -> None:
        reported.append(process)
        raise LeaseLost("the turn is no longer ours")

    with pytest.raises(LeaseLost):
        run_command(
            ["touch", "ran"],
            cwd=tmp_path,
            env={"PATH": os.defpath},
            timeout=5,
            output_limit=100,
            report=refuse,
        )
    assert len(reported) == 1  # it was spawned, held at the gate, and let go unrun
    assert not (tmp_path / "ran").exists()
    wait_until_gone(reported[0].pid)


# ---------------------------------------------------------------- tools file


def test_a_tool_declared_in_a_file_is_listed_and_callable(
    settings: Settings, tmp_path: Path
) -> None:
    tools_file = tmp_path / "tools.toml"
    tools_file.write_text(TOOLS_TOML)
    listed = subprocess.run(
        [sys.executable, "-m", "turnlog", "tools", "list", "--json"],
        capture_output=True,
        text=True,
        env=turnlog_env(settings, TURNLOG_TOOLS_FILE=str(tools_file)),
        cwd=ROOT,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    greet = {t["name"]: t for t in json.loads(listed.stdout)}["greet"]
    assert greet["effect"] == "read_only"
    assert greet["parameters"]["required"] == ["name"]

    rt = build_runtime(settings.model_copy(update={"tools_file": tools_file}))
    try:
        session_id = new_session(rt)
        hostile = "$(touch pwned); echo `id` > also"
        call = call_tool(rt, session_id, "greet", {"name": hostile, "times": 2})
        assert call.result["stdout"] == f"{hostile}|--times=2|"
        # An optional argument left out drops its element.
        again = call_tool(rt, session_id, "greet", {"name": "ada"})
        assert again.result["stdout"] == "ada||"
        turn = rt.sessions.get_record(session_id).turns[-1]
        assert turn.reply == f"Tool greet returned: {json.dumps(again.result, sort_keys=True)}"
        refused = call_tool(rt, session_id, "greet", {"name": "ada", "shell": "rm -rf /"})
        assert refused.state == "failed" and "unexpected argument 'shell'" in refused.error
        assert sorted(p.name for p in (rt.settings.sandbox_root / str(session_id)).iterdir()) == []
    finally:
        rt.close()


BAD_FILES = {
    "schema type": (
        '[[tools]]\nname = "t"\ndescription = "d"\ncommand = ["true"]\n'
        '[tools.parameters]\ntype = "object"\n[tools.parameters.properties.n]\ntype = "int"\n',
        "parameters.properties.n.type 'int' is not one of",
    ),
    "schema not an object": (
        '[[tools]]\nname = "t"\ndescription = "d"\ncommand = ["true"]\n'
        '[tools.parameters]\ntype = "array"\n',
        '"type": "object"',
    ),
    "unknown effect": (
        '[[tools]]\nname = "t"\ndescription = "d"\ncommand = ["true"]\neffect = "harmless"\n',
        "unknown effect 'harmless'",
    ),
    "duplicate in file": (
        '[[tools]]\nname = "t"\ndescription = "d"\ncommand = ["true"]\n' * 2,
        "tool 't' declared twice",
    ),
    "duplicate of a built-in": (
        '[[tools]]\nname = "echo"\ndescription = "d"\ncommand = ["true"]\n',
        "tool 'echo' is declared twice",
    ),
    "undeclared placeholder": (
        '[[tools]]\nname = "t"\ndescription = "d"\ncommand = ["cat", "{path}"]\n',
        "placeholder {path}",
    ),
    "program from the model": (
        '[[tools]]\nname = "t"\ndescription = "d"\ncommand = ["{p}"]\n'
        '[tools.parameters]\ntype = "object"\n[tools.parameters.properties.p]\ntype = "string"\n',
        "must not be a placeholder",
    ),
    "command as a string": (
        '[[tools]]\nname = "t"\ndescription = "d"\ncommand = "rm -rf /"\n',
        "command must be a non-empty list",
    ),
    "typo in a key": (
        '[[tools]]\nname = "t"\ndescription = "d"\ncommand = ["true"]\neffects = "read_only"\n',
        "unknown keys ['effects']",
    ),
    "not TOML": ("[[tools]\n", "is not valid toml"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_bad_tools_file_is_refused_with_a_clear_error(
    case: str, settings: Settings, tmp_path: Path
) -> None:
    text, expected = BAD_FILES[case]
    tools_file = tmp_path / "tools.toml"
    tools_file.write_text(text)
    with pytest.raises(ConfigurationError) as refused:
        build_tools(settings.model_copy(update={"tools_file": tools_file}))
    assert str(tools_file) in refused.value.detail
    assert expected in refused.value.detail


def test_a_bad_tools_file_stops_the_command_at_start_up(settings: Settings, tmp_path: Path) -> None:
    tools_file = tmp_path / "tools.json"
    tools_file.write_text(
        json.dumps(
            {
                "tools": [
                    {
                        "name": "t",
                        "description": "d",
                        "command": ["true"],
                        "parameters": {"type": "object", "properties": {"n": "a string"}},
                    }
                ]
            }
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "turnlog", "sessions", "list"],
        capture_output=True,
        text=True,
        env=turnlog_env(settings, TURNLOG_TOOLS_FILE=str(tools_file)),
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 2
    message = " ".join(done.stderr.split())  # rich may wrap long lines
    assert "invalid configuration" in message and "tools.json" in message
    assert "parameters.properties.n must be an object" in message
    assert "Traceback" not in done.stderr


def test_a_json_tools_file_declares_tools_too(tmp_path: Path) -> None:
    tools_file = tmp_path / "tools.json"
    tools_file.write_text(
        json.dumps({"tools": [{"name": "when", "description": "Date.", "command": ["date"]}]})
    )
    [tool] = load_tools_file(tools_file, 1024)
    assert tool.spec.name == "when" and tool.spec.effect == Effect.SIDE_EFFECTING  # the default


# ---------------------------------------------------------------- identity and fencing


def test_only_a_process_whose_pid_and_start_time_match_the_record_is_killed() -> None:
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        real = identify(proc.pid)
        assert real is not None and is_alive(real)
        impostors = [
            ToolProcess(real.pid, real.started_at + 1, real.host, real.boot_id),  # reused pid
            ToolProcess(real.pid, real.started_at, "another-host", real.boot_id),
            ToolProcess(real.pid, real.started_at, real.host, "an-earlier-boot"),
        ]
        for impostor in impostors:
            assert not is_alive(impostor)
            assert kill_group(impostor) is False
        assert proc.poll() is None  # untouched
        assert kill_group(real) is True
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_recording_a_tool_process_is_fenced_by_claim_and_attempt() -> None:
    # Pure domain: no database. (Kept here, next to the tools that report processes.)
    session = Session.start(title="fencing")
    turn, _ = session.submit_turn("/tool shell")
    claim = session.claim_turn(turn.turn_id, "w1")
    session.record_model_reply(
        turn.turn_id, claim, "", [{"call_id": "c1", "name": "shell", "arguments": {}}]
    )
    process = ToolProcess(pid=4242, started_at=99, host="h", boot_id="b")
    with pytest.raises(domain_errors.InvalidTransition):  # not started yet
        session.record_tool_process(turn.turn_id, claim, "c1", 1, process)
    attempt = session.start_tool_call(turn.turn_id, claim, "c1", "w1", Effect.SIDE_EFFECTING)
    with pytest.raises(domain_errors.StaleClaim):
        session.record_tool_process(turn.turn_id, claim + 1, "c1", attempt, process)
    with pytest.raises(domain_errors.InvalidTransition):
        session.record_tool_process(turn.turn_id, claim, "c1", attempt + 1, process)
    with pytest.raises(domain_errors.InvalidInput):
        session.record_tool_process(turn.turn_id, claim, "c1", attempt, ToolProcess(0, 99))

    session.record_tool_process(turn.turn_id, claim, "c1", attempt, process)

    event = session.collect_events()[-1]
    assert type(event) is Session.ToolCallProcessStarted
    assert event.TOPIC == "turnlog.session.ToolCallProcessStarted.v1"
    assert (event.pid, event.process_started_at, event.attempt) == (4242, 99, 1)
    assert session.call("c1").processes == [
        {"attempt": 1, "pid": 4242, "process_started_at": 99, "host": "h", "boot_id": "b"}
    ]


def test_the_readme_example_of_a_tools_file_loads(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    example = readme.split("```toml\n", 1)[1].split("```", 1)[0]
    tools_file = tmp_path / "tools.toml"
    tools_file.write_text(example)
    [tool] = load_tools_file(tools_file, 1024)
    assert tool.spec.name == "word_count" and tool.spec.effect == Effect.READ_ONLY


def test_each_call_gets_an_idempotency_key_unique_across_sessions_and_namespaces(
    shell_runtime: Runtime, settings: Settings
) -> None:
    from turnlog.application.tools.context import idempotency_key

    show = {"command": 'printf "%s|%s" "$TURNLOG_CALL_ID" "$TURNLOG_IDEMPOTENCY_KEY"'}
    first, second = new_session(shell_runtime), new_session(shell_runtime)
    calls = [call_tool(shell_runtime, sid, "shell", show) for sid in (first, second)]

    seen = [c.result["stdout"].split("|") for c in calls]
    assert seen[0][0] == seen[1][0]  # the provider gave both sessions the same call id
    assert seen[0][1] != seen[1][1]  # but the tools were given different keys
    for sid, call, (call_id, key) in zip((first, second), calls, seen, strict=True):
        assert call_id == call.call_id
        assert key == idempotency_key(settings.namespace, str(sid), call.call_id)
    other_namespace = idempotency_key("elsewhere", str(first), calls[0].call_id)
    assert other_namespace != seen[0][1]


DEPLOY_TOML = """
[[tools]]
name = "deploy"
description = "Deploy to an environment."
command = ["printf", "deployed to %s", "{env}"]

[tools.parameters]
type = "object"
required = ["env"]
additionalProperties = false
[tools.parameters.properties.env]
type = "string"
enum = ["staging", "prod"]
"""


def test_arguments_outside_a_declared_enum_are_answered_as_an_error_and_never_run(
    settings: Settings, database: Database, tmp_path: Path
) -> None:
    tools_file = tmp_path / "tools.toml"
    tools_file.write_text(DEPLOY_TOML)
    rt = build_runtime(settings.model_copy(update={"tools_file": tools_file}))
    try:
        session_id = new_session(rt)
        refused = call_tool(rt, session_id, "deploy", {"env": "--help; not-an-env"})
        assert refused.state == "failed"
        assert "argument 'env': '--help; not-an-env' is not one of" in refused.error
        topics = [r[3] for r in raw_events(database, settings.namespace, session_id)]
        assert not any("ToolCallProcessStarted" in t for t in topics)  # nothing was spawned
        assert any("ToolCallFailed" in t for t in topics)  # recorded
        # The model was answered with the error (the fixture provider repeats it).
        reply = rt.sessions.get_record(session_id).turns[-1].reply
        assert reply.startswith("Tool deploy returned:") and "is not one of" in reply
        ran = call_tool(rt, session_id, "deploy", {"env": "staging"})
        assert ran.result["stdout"] == "deployed to staging"
    finally:
        rt.close()


@pytest.mark.parametrize("platform", ["darwin", "win32"])
def test_command_tools_are_refused_at_start_up_where_processes_cannot_be_identified(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, platform: str
) -> None:
    tools_file = tmp_path / "tools.toml"
    tools_file.write_text(TOOLS_TOML)
    monkeypatch.setattr(sys, "platform", platform)
    for update in ({"shell_tool": True}, {"tools_file": tools_file}):
        with pytest.raises(ConfigurationError) as refused:
            build_tools(settings.model_copy(update=update))
        assert "need Linux with /proc" in refused.value.detail
        assert platform in refused.value.detail
    # The built-in tools need no process identity: they are offered everywhere.
    assert build_tools(settings).names() == ["append_file", "echo", "sleep"]


def test_command_tools_need_proc_even_on_linux(tmp_path: Path) -> None:
    from turnlog.application.tools.processes import unsupported_reason

    assert unsupported_reason("linux") == ""
    assert "need Linux with /proc" in unsupported_reason("linux", proc=tmp_path / "no-proc")
