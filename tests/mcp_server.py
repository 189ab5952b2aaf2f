"""A small MCP server over stdio for the tests, on the ``mcp`` package's server API.

``python -m tests.mcp_server`` serves the tools below. ``python -m tests.mcp_server
raw MODE`` is a hand-written JSON-RPC server for what the SDK's server would not
send: ``no-schema`` (a tool without ``inputSchema``), ``duplicate`` (two tools
with one name).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from mcp.server.fastmcp import Context, FastMCP
from mcp.types import ToolAnnotations

server = FastMCP("turnlog-test")
READ_ONLY = ToolAnnotations(readOnlyHint=True)
IDEMPOTENT = ToolAnnotations(readOnlyHint=False, idempotentHint=True)


@server.tool(annotations=READ_ONLY)
def echo(text: str) -> str:
    """Return the text."""
    return text


@server.tool(annotations=READ_ONLY)
def meta(ctx: Context) -> dict[str, Any]:  # type: ignore[type-arg]
    """Return the request's _meta as the server received it."""
    received = ctx.request_context.meta
    return received.model_dump(mode="json", exclude_none=True) if received else {}


@server.tool(annotations=IDEMPOTENT)
def store(path: str, value: str) -> dict[str, str]:
    """Write value to the file at path (the same call twice leaves the same file)."""
    Path(path).write_text(value)
    return {"stored": value}


@server.tool()
def append(path: str, text: str, delay: float = 0.0) -> dict[str, bool]:
    """Append a line to the file at path after delay seconds (path.started marks the start)."""
    Path(path + ".started").write_text(str(os.getpid()))
    time.sleep(delay)
    with open(path, "a") as out:
        out.write(text + "\n")
    return {"written": True}


@server.tool()
def slow_once(path: str, text: str, delay: float) -> dict[str, bool]:
    """Append a line to the file at path; the first call (no path.started yet) waits delay first."""
    marker = Path(path + ".started")
    if not marker.exists():
        marker.write_text(str(os.getpid()))
        time.sleep(delay)
    with open(path, "a") as out:
        out.write(text + "\n")
    return {"written": True}


COUNT = [0]  # this server process's state: a stateful server keeps it between calls


@server.tool()
def count() -> dict[str, int]:
    """Add one to this process's counter; the new value, and the server's pid."""
    COUNT[0] += 1
    return {"count": COUNT[0], "pid": os.getpid()}


@server.tool()
def attempt(what: str, target: str = "") -> dict[str, Any]:
    """Try what a sandbox must refuse: read, list, write, connect, environ, big_file, fork,
    allocate, kill_parent."""
    import socket

    try:
        if what == "read":
            return {"ok": True, "data": Path(target).read_text(errors="replace")[:2000]}
        if what == "list":
            return {"ok": True, "data": sorted(os.listdir(target))}
        if what == "write":
            Path(target).write_text("escaped")
            return {"ok": True}
        if what == "connect":
            with socket.create_connection(("127.0.0.1", int(target)), timeout=5):
                return {"ok": True}
        if what == "environ":
            return {"ok": True, "data": dict(os.environ)}
        if what == "big_file":  # 2 MiB, over a 1 MiB file-size limit
            with open(target, "wb") as out:
                out.write(b"x" * (2 * 1024 * 1024))
            return {"ok": True}
        if what == "fork":  # until the process limit says no; the children are left behind
            children = 0
            try:
                while True:
                    if os.fork() == 0:
                        time.sleep(30)
                        os._exit(0)
                    children += 1
            except OSError as exc:
                return {"ok": False, "error": f"fork refused after {children}: {exc}"}
        if what == "allocate":
            return {"ok": True, "data": len(bytearray(4 << 30))}
        if what == "kill_parent":
            os.kill(os.getppid(), 9)
            os.kill(1, 9)
            return {"ok": True}
    except MemoryError:
        return {"ok": False, "error": "MemoryError"}
    except OSError as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": False, "error": f"unknown attempt {what!r}"}


@server.tool(annotations=READ_ONLY)
def hang(seconds: float) -> str:
    """Sleep for seconds, then answer."""
    time.sleep(seconds)
    return "woke"


@server.tool()
def crash_once(path: str) -> str:
    """The first call (no file at path yet) kills this server mid-call; later ones answer."""
    marker = Path(path)
    if not marker.exists():
        marker.write_text("crashed")
        os._exit(3)
    return "survived"


def raw(mode: str) -> None:
    """Answer initialize and tools/list by hand, with the listing ``mode`` asks for."""
    schema = {"type": "object", "properties": {}}
    tools: list[dict[str, Any]] = {
        "no-schema": [{"name": "loose", "description": "No input schema."}],
        "duplicate": [
            {"name": "twin", "description": "One.", "inputSchema": schema},
            {"name": "twin", "description": "Two.", "inputSchema": schema},
        ],
    }[mode]
    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message:
            continue  # a notification
        if message["method"] == "initialize":
            result: dict[str, Any] = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "raw", "version": "0"},
            }
        elif message["method"] == "tools/list":
            result = {"tools": tools}
        else:
            result = {}
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}))
        sys.stdout.write("\n")
        sys.stdout.flush()


if __name__ == "__main__":
    if sys.argv[1:2] == ["raw"]:
        raw(sys.argv[2])
    else:
        server.run()
