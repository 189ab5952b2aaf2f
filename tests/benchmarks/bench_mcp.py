"""Figure 14: an MCP tool call after the first, against the first and an in-process tool.

One runtime with ``tests/mcp_server.py`` declared in its tools file. Its first
call to the server's ``count`` tool starts the server (spawn, initialise, list);
every later call goes to the same session. The figure is the p50 of calls
2..N, set against the first and against the built-in ``echo`` (a function in
this process), in the same run; and the same through whole turns (each a
model step, the call's intent and result committed), MCP against ``echo``.
Calls used to start a server each (about 0.85 s a call here).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from tests.benchmarks.bench_throughput import Config
from tests.benchmarks.suite import Figure, Row, Stat, fmt, percentile, scratch_namespace
from tests.conftest import ROOT
from turnlog.application.runtime import Runtime
from turnlog.application.store.database import Database
from turnlog.application.tools.context import ToolContext
from turnlog.interface.bootstrap import build_runtime

TARGET_MS = 50.0


def _tools_file(where: Path) -> Path:
    path = where / "tools.toml"
    command = json.dumps([sys.executable, "-m", "tests.mcp_server"])
    path.write_text(f'[[mcp_servers]]\nname = "demo"\ncommand = {command}\ncwd = "{ROOT}"\n')
    return path


def _call_ms(rt: Runtime, name: str, arguments: dict[str, Any], sandbox: Path) -> float:
    """One call, timed with its lookup (the first lookup of an MCP tool starts the server)."""
    context = ToolContext("bench", "call", 1, sandbox)
    started = time.perf_counter()
    tool = rt.executor.tools.get(name)
    assert tool is not None
    tool.run(arguments, context)
    return (time.perf_counter() - started) * 1000


def _turn_ms(rt: Runtime, session_id: Any, message: str) -> float:
    started = time.perf_counter()
    turn = rt.send(session_id, message).turn
    elapsed = (time.perf_counter() - started) * 1000
    assert turn.state == "completed", turn.error
    return elapsed


def figure_14(db: Database, cfg: Config) -> Figure:
    calls = cfg.pick(200, 30)
    turns = cfg.pick(60, 10)
    with scratch_namespace(db) as settings:
        settings = settings.model_copy(update={"tools_file": _tools_file(settings.data_dir)})
        # One-shot: the server starts at the first call, not at start-up.
        rt = build_runtime(settings, load_tools=False)
        try:
            sandbox = settings.data_dir
            first = _call_ms(rt, "demo_count", {}, sandbox)
            later = [_call_ms(rt, "demo_count", {}, sandbox) for _ in range(calls - 1)]
            local = [_call_ms(rt, "echo", {"text": "x"}, sandbox) for _ in range(calls - 1)]
            session_id = rt.sessions.create_session(tools=["demo_count", "echo"]).session_id
            mcp_turns, echo_turns = [], []
            for _ in range(turns):  # interleaved: both see the same machine
                mcp_turns.append(_turn_ms(rt, session_id, "/tool demo_count {}"))
                echo_turns.append(_turn_ms(rt, session_id, '/tool echo {"text": "x"}'))
        finally:
            rt.close()
    later_p50, local_p50 = percentile(later, 50), percentile(local, 50)
    extra = percentile(mcp_turns, 50) - percentile(echo_turns, 50)
    mcp, echo = Stat(mcp_turns, "ms"), Stat(echo_turns, "ms")
    return Figure(
        14,
        "an MCP call after the first",
        [
            Row(
                "14a",
                f"MCP call 2..{calls}, p50 (vs the first, which starts the server)",
                Stat([later_p50], "ms"),
                Stat([first], "ms"),
                later_p50 / first,
                f"≤ {TARGET_MS:g} ms",
                later_p50 <= TARGET_MS,
            ),
            Row(
                "14b",
                f"MCP call 2..{calls}, p50 (vs the in-process echo tool, p50)",
                Stat([later_p50], "ms"),
                Stat([local_p50], "ms"),
                later_p50 / local_p50 if local_p50 else None,
                "",
                None,
                ratio_label=f"+{fmt(later_p50 - local_p50)} ms",
            ),
            Row(
                "14c",
                f"a turn calling the MCP tool, {turns} turns (vs one calling echo)",
                mcp,
                echo,
                mcp.median / echo.median,
                f"≤ +{TARGET_MS:g} ms",
                extra <= TARGET_MS,
                ratio_label=f"+{fmt(extra)} ms",
            ),
        ],
        how=(
            "One runtime (`build_runtime`, tools listed on first use) with"
            " `tests/mcp_server.py` over stdio in its tools file. The first call of its"
            f" `count` tool starts the server; calls 2..{calls} reuse its session; the"
            f" built-in `echo` is called {calls - 1} times the same way (`Tool.run`, no"
            f" record). Then {turns} turns of each, interleaved, through the agent loop"
            " (fixture provider, `/tool NAME {...}`: the intent, the server's pid and the"
            " result committed). Targets: p50 of calls 2..N at most"
            f" {TARGET_MS:g} ms, and a turn's p50 at most {TARGET_MS:g} ms over echo's."
            f" First call {fmt(first)} ms; p50s {fmt(later_p50)} ms (MCP) and"
            f" {fmt(local_p50)} ms (echo)."
        ),
        details={
            "first_call_ms": first,
            "later_calls_p90_ms": percentile(later, 90),
            "echo_calls_p50_ms": local_p50,
        },
    )
