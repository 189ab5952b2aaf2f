"""MCP servers as tool sources: discovery, effect classes, _meta, arguments, timeouts, deaths.

The server is ``tests/mcp_server.py`` (the ``mcp`` package's server API, over
stdio), declared in a tools file. The fixture provider calls its tools
(``/tool NAME {json}``) through the agent loop.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest

from tests.api.conftest import eventually
from tests.conftest import ROOT, raw_events, turnlog_env
from tests.deadlines import scaled
from turnlog.application.errors import ConfigurationError
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database
from turnlog.application.tools.containment import check_host
from turnlog.application.tools.context import ToolContext, idempotency_key
from turnlog.application.tools.processes import identify, proc_stat
from turnlog.application.tools.sandboxes import Sandboxes
from turnlog.domain.turns import Effect
from turnlog.interface.bootstrap import build_runtime, build_tools

SERVER = [sys.executable, "-m", "tests.mcp_server"]


def server_entry(name: str, *, command: list[str] | None = None, **more: Any) -> str:
    lines = ["[[mcp_servers]]", f"name = {json.dumps(name)}", f"cwd = {json.dumps(str(ROOT))}"]
    if "url" not in more:
        lines.append(f"command = {json.dumps(command or SERVER)}")
    tools = more.pop("tools", {})
    lines += [f"{key} = {_toml(value)}" for key, value in more.items()]
    for tool, options in tools.items():
        lines.append(f"[mcp_servers.tools.{tool}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in options.items()]
    return "\n".join(lines) + "\n"


def _toml(value: Any) -> str:
    if isinstance(value, dict):  # an inline table
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


def tools_file(tmp_path: Path, *entries: str) -> Path:
    path = tmp_path / "tools.toml"
    path.write_text("\n".join(entries))
    return path


STANDARD = (
    server_entry("demo", tools={"hang": {"timeout_seconds": 1}}),
    # The same server again, its side-effecting tools declared read_only by the file.
    server_entry(
        "ro",
        tools={"slow_once": {"effect": "read_only"}, "crash_once": {"effect": "read_only"}},
    ),
)


@pytest.fixture
def mcp_settings(settings: Settings, tmp_path: Path) -> Settings:
    # Unconfined: the test server's tools write where the tests look (tmp_path);
    # test_a_stdio_server_runs_in_the_sandbox covers the sandbox.
    return settings.model_copy(
        update={"tools_file": tools_file(tmp_path, *STANDARD), "sandbox": "off"}
    )


@pytest.fixture
def mcp_runtime(mcp_settings: Settings) -> Iterator[Runtime]:
    rt = build_runtime(mcp_settings)
    yield rt
    rt.close()


def ask(rt: Runtime, name: str, arguments: dict[str, Any]) -> tuple[UUID, Any]:
    session_id = rt.sessions.create_session(tools=rt.executor.tools.names()).session_id
    turn = rt.send(session_id, f"/tool {name} {json.dumps(arguments)}").turn
    return session_id, turn


def topics(database: Database, namespace: str, session_id: UUID) -> list[str]:
    return [r[3].split(".")[2] for r in raw_events(database, namespace, session_id)]


# ------------------------------------------------------------ discovery


def test_a_servers_tools_are_discovered_with_schemas_and_effect_classes(
    mcp_settings: Settings,
) -> None:
    tools = build_tools(mcp_settings)
    try:
        specs = {s.name: s for s in tools.specs([]) if s.name.startswith(("demo_", "ro_"))}
    finally:
        tools.close()

    assert {n for n in specs if n.startswith("demo_")} == {
        "demo_echo", "demo_meta", "demo_store", "demo_append", "demo_hang", "demo_crash_once",
        "demo_slow_once", "demo_count", "demo_attempt",
    }  # fmt: skip
    effects = {name: spec.effect for name, spec in specs.items()}
    assert effects["demo_echo"] is Effect.READ_ONLY  # readOnlyHint
    assert effects["demo_store"] is Effect.IDEMPOTENT  # idempotentHint
    assert effects["demo_append"] is Effect.SIDE_EFFECTING  # no annotation: never assumed safe
    assert effects["ro_slow_once"] is Effect.READ_ONLY  # the tools file wins
    echo = specs["demo_echo"]
    assert echo.description == "Return the text."
    assert echo.parameters["properties"]["text"]["type"] == "string"
    assert echo.parameters["required"] == ["text"]


def test_a_call_runs_on_the_server_and_its_answer_is_the_result(mcp_runtime: Runtime) -> None:
    _, turn = ask(mcp_runtime, "demo_echo", {"text": "over stdio"})
    # The server's structured content when it gives one (FastMCP wraps a str as "result").
    assert turn.state == "completed"
    assert turn.reply == 'Tool demo_echo returned: {"result": "over stdio"}'


def test_the_idempotency_key_travels_in_the_requests_meta(mcp_runtime: Runtime) -> None:
    session_id, turn = ask(mcp_runtime, "demo_meta", {})
    meta = json.loads(turn.reply.removeprefix("Tool demo_meta returned: "))
    [call_id] = turn.steps[0].call_ids
    namespace = mcp_runtime.settings.namespace
    assert meta["turnlog/idempotency_key"] == idempotency_key(namespace, str(session_id), call_id)
    assert (meta["turnlog/call_id"], meta["turnlog/attempt"]) == (call_id, 1)


def test_arguments_are_checked_against_the_input_schema_before_anything_runs(
    mcp_runtime: Runtime, tmp_path: Path
) -> None:
    target = tmp_path / "never.txt"
    _, turn = ask(mcp_runtime, "demo_append", {"path": str(target), "text": 7})
    assert "demo_append: invalid arguments" in turn.reply and "text" in turn.reply
    _, turn = ask(mcp_runtime, "demo_append", {"text": "no path"})
    assert "missing required argument 'path'" in turn.reply
    assert not Path(f"{target}.started").exists()  # the server never saw the call


def test_a_hanging_tool_is_bounded_by_its_timeout(mcp_runtime: Runtime) -> None:
    started = time.monotonic()
    _, turn = ask(mcp_runtime, "demo_hang", {"seconds": 120})
    assert "demo_hang: no answer within 1s (timeout)" in turn.reply
    assert time.monotonic() - started < scaled(30)
    # The overrun cut the server off; the next call gets a new one (its state starts again).
    _, turn = ask(mcp_runtime, "demo_count", {})
    assert json.loads(turn.reply.removeprefix("Tool demo_count returned: "))["count"] == 1


def test_a_tool_reporting_an_error_fails_the_call(mcp_runtime: Runtime) -> None:
    _, turn = ask(mcp_runtime, "demo_store", {"path": "/nonexistent/dir/file", "value": "v"})
    assert turn.state == "completed"
    assert "Tool demo_store returned: error: demo_store:" in turn.reply


# ------------------------------------------------- one session per server


def test_a_stateful_server_keeps_its_state_across_ten_calls_by_one_worker(
    mcp_runtime: Runtime,
) -> None:
    session_id = mcp_runtime.sessions.create_session(tools=["demo_count"]).session_id
    answers = []
    for _ in range(10):
        turn = mcp_runtime.send(session_id, "/tool demo_count {}").turn
        answers.append(json.loads(turn.reply.removeprefix("Tool demo_count returned: ")))

    assert [a["count"] for a in answers] == list(range(1, 11))
    [pid] = {a["pid"] for a in answers}  # one server process served all ten
    session = mcp_runtime.sessions.get_record(session_id)
    recorded = [p for call in session.calls.values() for p in call.processes]
    assert len(recorded) == 10  # each call recorded the server that ran it
    assert {(p["pid"], p["server"]) for p in recorded} == {(pid, "demo")}
    started = {p["process_started_at"] for p in recorded}
    assert started == {identify(pid).started_at}  # type: ignore[union-attr]


@pytest.mark.skipif(not check_host().ok, reason="no sandbox on this host")
@pytest.mark.parametrize("linked", [False, True], ids=["program", "program-behind-a-link"])
def test_a_stdio_server_runs_in_the_sandbox(
    settings: Settings, tmp_path: Path, linked: bool
) -> None:
    python, cwd = Path(sys.executable), ROOT
    if linked:  # a checkout (its cwd) whose .venv links to the real one, as here
        cwd = tmp_path / "checkout"
        (cwd / "tests").mkdir(parents=True)
        for name in ("__init__.py", "mcp_server.py"):
            shutil.copy(ROOT / "tests" / name, cwd / "tests" / name)
        (cwd / ".venv").symlink_to(python.parent.parent)
        python = cwd / ".venv" / python.parent.name / python.name
    entry = server_entry(
        "boxed",
        command=[str(python), "-m", "tests.mcp_server"],
        sandbox={"open_files": 256},
    ).replace(json.dumps(str(ROOT)), json.dumps(str(cwd)))
    path = tools_file(tmp_path, entry)
    rt = build_runtime(settings.model_copy(update={"tools_file": path}))
    try:
        session_id = rt.sessions.create_session(tools=["boxed_count", "boxed_store"]).session_id
        counts = [
            json.loads(rt.send(session_id, "/tool boxed_count {}").turn.reply.split(": ", 1)[1])
            for _ in range(3)
        ]
        outside = tmp_path / "outside.txt"
        store = {"path": str(outside), "value": "x"}
        refused = rt.send(session_id, f"/tool boxed_store {json.dumps(store)}").turn.reply
        home = rt.settings.data_dir.resolve() / "mcp" / rt.settings.namespace / "boxed"
        inside = {"path": str(home / "inside.txt"), "value": "y"}
        stored = rt.send(session_id, f"/tool boxed_store {json.dumps(inside)}").turn.reply
        session = rt.sessions.get_record(session_id)
    finally:
        rt.close()

    assert [c["count"] for c in counts] == [1, 2, 3]  # one sandboxed server, its state kept
    assert {c["pid"] for c in counts} == {2}  # in a pid namespace of its own
    assert "error: boxed_store:" in refused and not outside.exists()  # nothing else writable
    assert '"stored": "y"' in stored and (home / "inside.txt").read_text() == "y"
    recorded = [p for call in session.calls.values() for p in call.processes]
    assert {p["server"] for p in recorded} == {"boxed"} and len(recorded) == 5


def test_sandbox_options_are_refused_for_an_http_server_and_checked_for_stdio(
    settings: Settings, tmp_path: Path
) -> None:
    for entry, cause in (
        (server_entry("far", url="http://127.0.0.1:9/mcp", sandbox={"network": True}), "HTTP"),
        (server_entry("neg", sandbox={"processes": -1}), "processes must be a whole number"),
        (server_entry("odd", sandbox={"colour": 1}), "unknown sandbox options"),
    ):
        bad = settings.model_copy(update={"tools_file": tools_file(tmp_path, entry)})
        with pytest.raises(ConfigurationError, match=cause):
            build_runtime(bad).close()


def test_concurrent_calls_from_several_threads_share_one_session(mcp_runtime: Runtime) -> None:
    tool = mcp_runtime.executor.tools.get("demo_count")
    assert tool is not None
    sandbox = mcp_runtime.settings.data_dir

    def call(n: int) -> Any:
        return tool.run({}, ToolContext("s", f"c{n}", 1, sandbox))

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(call, range(8)))

    assert sorted(a["count"] for a in answers) == list(range(1, 9))
    assert len({a["pid"] for a in answers}) == 1


def test_gc_leaves_the_server_of_a_live_worker_alone(mcp_runtime: Runtime) -> None:
    session_id, turn = ask(mcp_runtime, "demo_count", {})
    assert turn.state == "completed"
    mcp_runtime.sessions.close_session(session_id, "finished", "ops")
    [tool] = [mcp_runtime.executor.tools.get("demo_count")]
    server = tool.sessions.processes()["demo"]  # type: ignore[union-attr]
    sandboxes = Sandboxes(mcp_runtime.sessions, mcp_runtime.settings.sandbox_root)

    assert [s.processes for s in sandboxes.scan() if s.session_id == str(session_id)] == [[]]
    actions = [(a.session_id, a.action) for a in sandboxes.gc()]

    assert (str(session_id), "removed") in actions  # the server is not the session's
    assert not any(a == "killed" for _, a in actions)
    assert not gone(server.pid)
    _, turn = ask(mcp_runtime, "demo_count", {})  # and it still serves
    assert json.loads(turn.reply.removeprefix("Tool demo_count returned: "))["count"] == 2


def test_looking_up_a_tool_by_name_starts_only_the_server_that_may_offer_it(
    mcp_settings: Settings,
) -> None:
    rt = build_runtime(mcp_settings, load_tools=False)  # as a one-shot command
    try:
        tool = rt.executor.tools.get("ro_echo")
        assert tool is not None and tool.spec.effect is Effect.READ_ONLY
        assert set(tool.sessions.processes()) == {"ro"}  # type: ignore[attr-defined]
        assert rt.executor.tools.get("nobody_echo") is None  # no server's prefix: none starts
        assert set(tool.sessions.processes()) == {"ro"}  # type: ignore[attr-defined]
    finally:
        rt.close()


# ------------------------------------------------ commands that run no tool

STARTS = "import pathlib, runpy, sys; pathlib.Path(sys.argv[1]).touch(); runpy.run_module('tests.mcp_server', run_name='__main__')"  # noqa: E501


def _cli(settings: Settings, tools: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = turnlog_env(settings, TURNLOG_TOOLS_FILE=str(tools), TURNLOG_SANDBOX="off")
    return subprocess.run(
        [sys.executable, "-m", "turnlog", *args],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=scaled(120),
    )  # fmt: skip


def test_commands_that_run_no_tool_start_no_server_and_do_not_need_one(
    settings: Settings, database: Database, tmp_path: Path
) -> None:
    started = tmp_path / "started"
    path = tools_file(
        tmp_path,
        server_entry("up", command=[sys.executable, "-c", STARTS, str(started)]),
        server_entry("down", command=["/nonexistent/mcp-server"]),
    )
    for command in (["db", "status"], ["check"], ["db", "init"], ["sessions", "list"]):
        done = _cli(settings, path, *command)
        assert done.returncode == 0, (command, done.stderr)
    assert not started.exists()  # no command above started a server

    # A command that needs the tools still refuses the server that is down, naming it.
    listed = _cli(settings, path, "tools", "list")
    assert listed.returncode == 2
    assert "MCP server 'down' could not start: FileNotFoundError" in listed.stderr


def test_a_message_is_not_taken_while_a_server_it_may_need_is_down(
    settings: Settings, database: Database, tmp_path: Path
) -> None:
    path = tools_file(tmp_path, server_entry("down", command=["/nonexistent/mcp-server"]))
    session_id = new_session(settings)

    done = _cli(settings, path, "sessions", "send", session_id, "hello")

    assert done.returncode == 2, done.stderr
    assert "MCP server 'down' could not start" in done.stderr
    assert "TurnSubmitted" not in topics(database, settings.namespace, UUID(session_id))


def new_session(settings: Settings) -> str:
    rt = build_runtime(settings)
    try:
        return str(rt.sessions.create_session().session_id)
    finally:
        rt.close()


# ------------------------------------------------------- bad servers


@pytest.mark.parametrize(
    ("entries", "cause"),
    [
        (
            [server_entry("gone", command=["/nonexistent/mcp-server"])],
            "MCP server 'gone' could not start: FileNotFoundError",
        ),
        (
            [server_entry("quits", command=[sys.executable, "-c", "import sys; sys.exit(2)"])],
            "MCP server 'quits' could not start",
        ),
        (
            [server_entry("loose", command=[*SERVER, "raw", "no-schema"])],
            "MCP server 'loose': tool 'loose' has no input schema",
        ),
        (
            [server_entry("twins", command=[*SERVER, "raw", "duplicate"])],
            "MCP server 'twins' lists two tools named 'twin'",
        ),
        (
            [server_entry("one", prefix="x_"), server_entry("two", prefix="x_")],
            "MCP server 'two': tool 'x_echo' is declared twice",
        ),
        (
            [server_entry("far", url="http://example.com/mcp")],
            "host 'example.com' is not in allowed_hosts",
        ),
        (
            [server_entry("typo", tools={"nope": {"effect": "read_only"}})],
            "the tools file names tools it does not list: \\['nope'\\]",
        ),
    ],
    ids=["no-such-command", "exits", "no-schema", "duplicate", "clash", "host", "unknown-tool"],
)
def test_a_server_that_cannot_be_used_is_refused_at_start_up_naming_the_cause(
    settings: Settings, tmp_path: Path, entries: list[str], cause: str
) -> None:
    path = tools_file(tmp_path, *entries)
    with pytest.raises(ConfigurationError, match=cause):
        build_runtime(settings.model_copy(update={"tools_file": path})).close()


# --------------------------------------------------- deaths mid-call


def test_a_server_dying_mid_call_interrupts_the_turn_of_a_side_effecting_tool(
    mcp_runtime: Runtime, database: Database, tmp_path: Path
) -> None:
    session_id, turn = ask(mcp_runtime, "demo_crash_once", {"path": str(tmp_path / "crash")})
    assert turn.state == "interrupted"
    assert topics(database, mcp_runtime.settings.namespace, session_id)[-3:] == [
        "ToolCallStarted",
        "ToolCallProcessStarted",  # the server, on record before the request left
        "TurnInterrupted",
    ]
    # The next call starts the server again.
    _, turn = ask(mcp_runtime, "demo_echo", {"text": "again"})
    assert turn.reply == 'Tool demo_echo returned: {"result": "again"}'


def test_a_server_dying_mid_call_runs_a_read_only_tool_again(
    mcp_runtime: Runtime, database: Database, tmp_path: Path
) -> None:
    session_id, turn = ask(mcp_runtime, "ro_crash_once", {"path": str(tmp_path / "crash")})
    assert turn.reply == 'Tool ro_crash_once returned: {"result": "survived"}'
    started = [
        t
        for t in topics(database, mcp_runtime.settings.namespace, session_id)
        if t == "ToolCallStarted"
    ]
    assert len(started) == 2  # attempt 1 died with its server; attempt 2 answered


# ------------------------------------------------ the worker killed mid-call


def _kill_mid_call(settings: Settings, tool: str, target: Path) -> str:
    env = turnlog_env(settings, TURNLOG_TOOLS_FILE=str(settings.tools_file), TURNLOG_SANDBOX="off")
    created = subprocess.run(
        [sys.executable, "-m", "turnlog", "sessions", "new"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    session_id = created.stdout.strip()
    arguments = {"path": str(target), "text": "written", "delay": 60}
    proc = subprocess.Popen(
        [sys.executable, "-m", "turnlog", "sessions", "send", session_id,
         f"/tool {tool} {json.dumps(arguments)}"],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    marker = Path(f"{target}.started")
    try:
        eventually(lambda: marker.exists() and marker.read_text(), deadline=90)  # in the call
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    server = int(marker.read_text())
    try:
        # The server dies with its worker: it cannot finish the call unseen.
        eventually(lambda: gone(server), deadline=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signal.SIGKILL)  # a failed check leaves nothing running
    return session_id


def gone(pid: int) -> bool:
    stat = proc_stat(pid)
    return stat is None or stat[1] in "ZX"


def _record(settings: Settings, session_id: str) -> Any:
    rt = build_runtime(settings.model_copy(update={"tools_file": None}))
    try:
        return rt.sessions.get_record(UUID(session_id))
    finally:
        rt.close()


def _send(settings: Settings, session_id: str, message: str) -> subprocess.CompletedProcess[str]:
    env = turnlog_env(settings, TURNLOG_TOOLS_FILE=str(settings.tools_file), TURNLOG_SANDBOX="off")
    return subprocess.run(
        [sys.executable, "-m", "turnlog", "sessions", "send", session_id, message],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=180,
    )  # fmt: skip


@pytest.mark.fault
def test_a_read_only_mcp_tool_whose_worker_was_killed_mid_call_is_run_again(
    mcp_settings: Settings, database: Database, tmp_path: Path
) -> None:
    target = tmp_path / "ro.txt"
    session_id = _kill_mid_call(mcp_settings, "ro_slow_once", target)

    done = _send(mcp_settings, session_id, '/tool demo_echo {"text": "next"}')

    assert done.returncode == 0, done.stderr
    kinds = topics(database, mcp_settings.namespace, UUID(session_id))
    assert kinds.count("ToolCallStarted") == 3  # killed attempt, its re-run, the next turn's
    assert "TurnInterrupted" not in kinds
    assert target.read_text() == "written\n"  # the re-run wrote; the killed attempt never did
    session = _record(mcp_settings, session_id)
    first = [p for p in session.calls[session.turns[0].steps[0].call_ids[0]].processes]
    assert first[0]["attempt"] == 1 and first[0]["server"] == "ro"  # the killed one, on record


@pytest.mark.fault
def test_a_side_effecting_mcp_tool_whose_worker_was_killed_mid_call_leaves_it_unknown(
    mcp_settings: Settings, database: Database, tmp_path: Path
) -> None:
    session_id = _kill_mid_call(mcp_settings, "demo_slow_once", tmp_path / "se.txt")

    done = _send(mcp_settings, session_id, "hello")

    assert done.returncode == 3, done.stderr  # refused: the turn is interrupted
    kinds = topics(database, mcp_settings.namespace, UUID(session_id))
    assert kinds[-1] == "TurnInterrupted" and kinds.count("ToolCallStarted") == 1


def _tagged(tag: str) -> list[int]:
    """Live processes whose argv holds ``tag`` (zombies are gone)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if tag.encode() in (entry / "cmdline").read_bytes() and not gone(int(entry.name)):
                found.append(int(entry.name))
    return found


@pytest.mark.fault
@pytest.mark.skipif(not check_host().ok, reason="no sandbox on this host")
def test_a_killed_worker_takes_its_sandboxed_server_with_it(
    settings: Settings, database: Database, tmp_path: Path
) -> None:
    tag = f"tag-{uuid4().hex}"  # in the server's argv: found again on the host, or not
    path = tools_file(tmp_path, server_entry("boxed", command=[*SERVER, tag]))
    boxed = settings.model_copy(update={"tools_file": path})
    env = turnlog_env(boxed, TURNLOG_TOOLS_FILE=str(path))
    created = subprocess.run(
        [sys.executable, "-m", "turnlog", "sessions", "new"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=scaled(120),
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    session_id = created.stdout.strip()
    target = boxed.data_dir.resolve() / "mcp" / boxed.namespace / "boxed" / "se.txt"
    arguments = {"path": str(target), "text": "written", "delay": 60}
    proc = subprocess.Popen(
        [sys.executable, "-m", "turnlog", "sessions", "send", session_id,
         f"/tool boxed_slow_once {json.dumps(arguments)}"],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        eventually(lambda: Path(f"{target}.started").exists(), deadline=90)  # in the call
        assert _tagged(tag)  # the sandbox and its server run
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    try:
        eventually(lambda: not _tagged(tag), deadline=30)  # nothing of it is left
    finally:
        for pid in _tagged(tag):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    done = subprocess.run(
        [sys.executable, "-m", "turnlog", "sessions", "send", session_id, "hello"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=scaled(180),
    )  # fmt: skip
    assert done.returncode == 3, done.stderr  # side_effecting, outcome unknown: interrupted
    assert not target.exists()  # the killed call never finished
