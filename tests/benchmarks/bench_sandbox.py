"""Figure 13: what the sandbox costs a trivial command call (p50, with vs without).

The ``shell`` tool runs ``true`` in a session's sandbox, the calls with the
sandbox (bubblewrap, setpriv or a user namespace, bash setting the limits) interleaved with
unconfined ones (``TURNLOG_SANDBOX=off``) so that the machine's load falls on
both alike. The whole tool call is timed: the gate, the record callback, the
spawn, the wait and the reading of its output.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from pathlib import Path

from tests.benchmarks.bench_throughput import Config
from tests.benchmarks.suite import Figure, Row, Stat
from turnlog.application.store.database import Database
from turnlog.application.tools.command import shell_tool
from turnlog.application.tools.containment import Containment, check_host
from turnlog.application.tools.context import ToolContext

TARGET_MS = 15.0


def figure_13(db: Database, cfg: Config) -> Figure:
    calls = cfg.pick(200, 40)
    host = check_host()
    tools = {on: shell_tool(10, 1024, containment=Containment(enabled=on)) for on in (True, False)}
    times: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="turnlog-bench-sandbox-") as top:
        sandbox = Path(top) / "sandboxes" / "default" / str(uuid.uuid4())
        sandbox.mkdir(parents=True)
        context = ToolContext(sandbox.name, "call", 1, sandbox)
        for on in (True, False):  # warm-up
            tools[on].run({"command": "true"}, context)
        for index in range(calls * 2):
            on = index % 2 == 0
            started = time.perf_counter()
            result = tools[on].run({"command": "true"}, context)
            times[on].append((time.perf_counter() - started) * 1000)
            assert result["exit_code"] == 0, result
    sandboxed, unconfined = Stat(times[True], "ms"), Stat(times[False], "ms")
    more = sandboxed.median - unconfined.median
    return Figure(
        13,
        "a trivial command call, sandboxed vs unconfined",
        [
            Row(
                "13",
                "`shell` call of `true`, p50 with the sandbox (vs without)",
                sandboxed,
                unconfined,
                more,
                f"≤ +{TARGET_MS:g} ms",
                host.ok and more <= TARGET_MS,
                ratio_label=f"+{more:.1f} ms",
            )
        ],
        how=(
            f"{calls} calls each of the `shell` tool running `true` in one session's sandbox,"
            " through CommandTool.run (the gate, the process record callback, spawn, wait,"
            " output), sandboxed and unconfined calls interleaved one by one, after one"
            f" warm-up call each. Sandbox mode: {host.mode or host.reason}. The figure is"
            " the difference of the medians (p50) in milliseconds."
        ),
        details={"p50_ms": {"sandboxed": sandboxed.median, "unconfined": unconfined.median}},
    )
