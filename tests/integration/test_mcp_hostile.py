"""The hostile-tools ring for an MCP server: a stdio server in the sandbox tries to get out.

The server is ``tests/mcp_server.py``; its ``attempt`` tool reads, lists, writes,
connects, fills a file, forks without end, allocates 4 GB, kills its parent and
overruns its timeout where the sandbox must refuse or bound it. Each attempt is
refused or bounded and says why; the server keeps serving, its state intact.
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from tests.conftest import ROOT
from tests.integration.test_command_tools import call_tool
from tests.integration.test_mcp_tools import server_entry, tools_file
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.application.tools.containment import Containment, check_host
from turnlog.application.tools.mcp_servers import discover, parse_server
from turnlog.application.tools.mcp_sessions import McpSessions
from turnlog.domain.turns import Effect
from turnlog.interface.bootstrap import build_runtime

NO_SANDBOX = pytest.mark.skipif(not check_host().ok, reason="no sandbox on this host")

SECRET = "sk-mcp-hostile-ring-must-not-leak"


@pytest.fixture
def boxed(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Runtime, UUID]]:
    monkeypatch.setenv("TURNLOG_TEST_SECRET", SECRET)  # this server's environment
    limits = {"file_size_mb": 1, "processes": 32, "address_space_mb": 1024}
    entry = server_entry("boxed", sandbox=limits, tools={"hang": {"timeout_seconds": 2}})
    rt = build_runtime(settings.model_copy(update={"tools_file": tools_file(tmp_path, entry)}))
    try:
        tools = ["boxed_attempt", "boxed_count", "boxed_hang"]
        yield rt, rt.sessions.create_session(tools=tools).session_id
    finally:
        rt.close()


def attempt(boxed: tuple[Runtime, UUID], what: str, target: str = "") -> dict[str, Any]:
    rt, session_id = boxed
    arguments = json.dumps({"what": what, "target": target})
    turn = rt.send(session_id, f"/tool boxed_attempt {arguments}").turn
    assert turn.state == "completed", turn.error
    answer: dict[str, Any] = json.loads(turn.reply.removeprefix("Tool boxed_attempt returned: "))
    return answer


@NO_SANDBOX
def test_the_hosts_and_this_servers_secrets_are_out_of_reach(
    boxed: tuple[Runtime, UUID],
) -> None:
    shadow = attempt(boxed, "read", "/etc/shadow")
    assert not shadow["ok"] and "PermissionError" in shadow["error"]
    init = attempt(boxed, "read", "/proc/1/environ")  # pid 1 of its own pid namespace
    assert SECRET not in json.dumps(init)
    environ = attempt(boxed, "environ")
    assert environ["ok"] and SECRET not in json.dumps(environ["data"])
    assert not any(k.startswith("TURNLOG_") for k in environ["data"])


@NO_SANDBOX
def test_other_sandboxes_and_the_data_directory_are_invisible_and_nothing_outside_is_writable(
    boxed: tuple[Runtime, UUID], tmp_path: Path
) -> None:
    rt, _ = boxed
    other = rt.settings.sandbox_root / "another-session"
    other.mkdir(parents=True)
    (other / "notes.txt").write_text("private")
    listed = attempt(boxed, "list", str(rt.settings.sandbox_root))
    assert not listed["ok"] or "another-session" not in listed["data"]
    read = attempt(boxed, "read", str(other / "notes.txt"))
    assert not read["ok"]
    outside = tmp_path / "escaped.txt"
    wrote = attempt(boxed, "write", str(outside))
    assert not wrote["ok"] and not outside.exists()


@NO_SANDBOX
def test_loopback_ports_are_unreachable_without_a_network_grant(
    boxed: tuple[Runtime, UUID],
) -> None:
    rt, _ = boxed
    port = int(rt.db.params.get("port", "5432"))
    socket.create_connection(("127.0.0.1", port), timeout=5).close()  # PostgreSQL, from here
    connected = attempt(boxed, "connect", str(port))
    assert not connected["ok"], connected  # no network namespace shared: nothing listens


@NO_SANDBOX
def test_a_file_over_the_limit_is_refused_and_the_server_keeps_serving(
    boxed: tuple[Runtime, UUID],
) -> None:
    rt, session_id = boxed
    home = rt.settings.data_dir.resolve() / "mcp" / rt.settings.namespace / "boxed"
    before = attempt(boxed, "write", str(home / "small.txt"))
    assert before["ok"]  # its home is writable
    big = attempt(boxed, "big_file", str(home / "big.bin"))
    assert not big["ok"] and "File too large" in big["error"]
    turn = rt.send(session_id, "/tool boxed_count {}").turn
    assert json.loads(turn.reply.removeprefix("Tool boxed_count returned: "))["count"] == 1


@NO_SANDBOX
def test_a_fork_bomb_4_gb_and_a_kill_of_the_parent_are_refused_and_it_keeps_serving(
    boxed: tuple[Runtime, UUID],
) -> None:
    rt, session_id = boxed
    bomb = attempt(boxed, "fork")
    assert not bomb["ok"] and "fork refused after" in bomb["error"], bomb
    assert int(bomb["error"].split()[3].rstrip(":")) < 32  # the server's own limit
    memory = attempt(boxed, "allocate")
    assert memory == {"ok": False, "error": "MemoryError"}
    parent = attempt(boxed, "kill_parent")
    assert not parent["ok"] and "PermissionError" in parent["error"], parent
    turn = rt.send(session_id, "/tool boxed_count {}").turn
    assert json.loads(turn.reply.removeprefix("Tool boxed_count returned: "))["count"] == 1
    other = rt.sessions.create_session(tools=["boxed_count"]).session_id
    assert rt.send(other, "/tool boxed_count {}").turn.state == "completed"


@NO_SANDBOX
def test_a_call_past_its_timeout_is_cut_off_with_its_server_and_the_next_call_is_served(
    boxed: tuple[Runtime, UUID],
) -> None:
    rt, session_id = boxed
    late = call_tool(rt, session_id, "boxed_hang", {"seconds": 60})
    assert late.state == "failed" and "no answer within 2s (timeout)" in late.error, late
    assert attempt(boxed, "environ")["ok"]  # a new server answers


def test_a_host_that_cannot_sandbox_gets_only_the_servers_tools_that_change_nothing(
    tmp_path: Path,
) -> None:
    entry = parse_server(
        {"name": "demo", "command": [sys.executable, "-m", "tests.mcp_server"], "cwd": str(ROOT)}
    )
    server = replace(
        entry, containment=Containment(bwrap="/nonexistent/bwrap"), home=str(tmp_path / "home")
    )
    sessions = McpSessions()
    try:
        offered = {t.spec.name: t.spec.effect for t in discover(server, sessions)}
        answer = offered and sessions.processes()
    finally:
        sessions.close()
    assert offered["demo_echo"] is Effect.READ_ONLY and "demo_store" in offered  # idempotent
    assert "demo_append" not in offered and "demo_count" not in offered  # side_effecting
    assert set(answer) == {"demo"}  # it runs, unconfined, with the warning
