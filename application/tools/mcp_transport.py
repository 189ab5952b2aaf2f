"""How turnlog reaches one MCP server: the stdio server's spawn, its pipes, the session.

``spawn_stdio`` is the one function that starts a stdio server: in a session
and process group of its own (its group can be killed at once), set to die
with the thread that spawned it (PR_SET_PDEATHSIG, checked against a parent
that died first), with the SDK's minimal environment and the file's ``env``,
inside the sandbox (``server_spawn``, application/tools/containment.py) with
a lifeline held until the server has ended. ``connected`` pumps
JSON-RPC lines between the server's pipes and the SDK's ``ClientSession``
(the SDK's own stdio client cannot take such a spawn), keeps the end of the
server's stderr for error messages, and ends the server on exit: stdin
closed, then its group killed if it has not exited within ``END_TIMEOUT``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from turnlog.application.tools.containment import Containment, Grant, check_host
from turnlog.application.tools.processes import die_with

if TYPE_CHECKING:
    from mcp import ClientSession

log = logging.getLogger("turnlog.mcp")

DEFAULT_TIMEOUT = 30.0  # a call's, unless the tools file says
END_TIMEOUT = 2.0  # after its stdin is closed, before its group is killed
MAX_MESSAGE_BYTES = 32 * 1024 * 1024  # one JSON-RPC line from a server
STDERR_TAIL = 4000  # characters of a server's stderr kept for error messages


@dataclass(frozen=True)
class McpServer:
    """One ``[[mcp_servers]]`` entry: where the server is and what the file says of its tools."""

    name: str
    command: tuple[str, ...] = ()
    url: str = ""
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    prefix: str = ""
    timeout: float = DEFAULT_TIMEOUT
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    # A stdio server's sandbox: how to make it, its grant, and its own writable directory.
    containment: Containment = field(default_factory=lambda: Containment(enabled=False))
    grant: Grant | None = None
    home: str = ""

    def __str__(self) -> str:
        return f"MCP server {self.name!r}"


def first_cause(exc: BaseException) -> BaseException:
    """The innermost first exception of (nested) exception groups."""
    inner: BaseException = exc
    while isinstance(inner, BaseExceptionGroup) and inner.exceptions:
        inner = inner.exceptions[0]
    return inner


def describe(exc: BaseException) -> str:
    exc = first_cause(exc)
    text = str(exc) or type(exc).__name__
    if isinstance(exc, OSError):
        return f"{type(exc).__name__}: {text}"
    return json.dumps(text)[1:-1][:300]


# ------------------------------------------------------------------ spawning


@dataclass(frozen=True)
class ServerSpawn:
    """What starts a stdio server; ``lifeline`` the descriptor it must be given, if any."""

    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    lifeline: int | None = None


def server_spawn(server: McpServer, lifeline: int) -> ServerSpawn:
    """The argv, environment and working directory that start a stdio server.

    In the sandbox (``containment``) when it is on and the host can make one:
    its own ``home`` the only writable directory, its command (the program,
    its install prefix) and ``cwd`` visible read-only, no network unless its
    ``sandbox`` table grants it, the tools file's limits, and ``lifeline`` (a
    pipe's read end, see ``Containment.wrap``). A host that cannot sandbox
    runs it as it is (with a warning; only its tools that change nothing are
    offered, ``mcp_servers._confined``).
    """
    argv, env = list(server.command), server_environment(server)
    if not server.containment.enabled or not server.home:
        return ServerSpawn(argv, env, server.cwd)
    host = check_host(server.containment)
    if not host.ok:
        log.warning("%s runs unconfined: no sandbox on this host (%s)", server, host.reason)
        return ServerSpawn(argv, env, server.cwd)
    if shutil.which(argv[0], path=env.get("PATH")) is None:  # said here, not by bash inside
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", argv[0])
    home = Path(server.home)
    home.mkdir(parents=True, exist_ok=True)
    spawn = server.containment.wrap(
        argv,
        sandbox=home,
        env=env,
        grant=server.grant,
        read_only=_visible(server, env),
        lifeline=lifeline,
    )
    wrapped = list(spawn.argv)
    if server.cwd:  # bwrap enters its cwd (read-only) rather than its home
        at = wrapped.index("--chdir") + 1
        wrapped[at] = os.path.realpath(server.cwd)
    return ServerSpawn(wrapped, spawn.env, str(home), lifeline)


def _visible(server: McpServer, env: dict[str, str]) -> list[Path]:
    """What the server must read: its program, that program's install prefix, its cwd.

    Real paths: a bind under a link (a checkout's ``.venv`` linking elsewhere)
    would show the link and not what it points to.
    """
    paths: list[Path] = []
    found = shutil.which(server.command[0], path=env.get("PATH"))
    if found:
        for folder in {Path(os.path.realpath(Path(found).parent)), Path(found).resolve().parent}:
            paths.append(folder)
            if folder.name == "bin":
                paths.append(folder.parent)  # a virtualenv or a prefix: its libraries
        if Path(found).resolve() == Path(sys.executable).resolve():
            paths += [Path(os.path.realpath(sys.prefix)), Path(os.path.realpath(sys.base_prefix))]
    if server.cwd:
        paths.append(Path(os.path.realpath(server.cwd)))
    return paths


def server_environment(server: McpServer) -> dict[str, str]:
    """The SDK's minimal environment (no TURNLOG_* settings, no keys), and the file's env."""
    from mcp.client.stdio import get_default_environment

    return {**get_default_environment(), **server.env}


async def spawn_stdio(server: McpServer) -> tuple[asyncio.subprocess.Process, int]:
    """Start a stdio server: the one function that does (pipes on stdin, stdout, stderr).

    Its own session and process group (so its group can be killed at once), and
    death with the spawning thread: the loop's, which lives as long as the process.
    Returns the process and the write end of its lifeline, to be closed once it
    has ended.
    """
    lifeline, held = os.pipe()
    try:
        spawn = server_spawn(server, lifeline)
        process = await asyncio.create_subprocess_exec(
            *spawn.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=spawn.env,
            cwd=spawn.cwd,
            start_new_session=True,
            preexec_fn=die_with(os.getpid()),
            pass_fds=() if spawn.lifeline is None else (lifeline,),
            limit=MAX_MESSAGE_BYTES,
        )
    except BaseException:
        os.close(held)
        raise
    finally:
        os.close(lifeline)
    return process, held


# ------------------------------------------------------------------ the transport


@dataclass
class Tail:
    """The end of a server's stderr: enough to say why it would not start."""

    text: str = ""

    def add(self, chunk: bytes) -> None:
        self.text = (self.text + chunk.decode("utf-8", errors="replace"))[-STDERR_TAIL:]

    def last_line(self) -> str:
        lines = [line.strip() for line in self.text.splitlines() if line.strip()]
        return f" (its stderr ends: {lines[-1][:300]!r})" if lines else ""


async def _pump_out(stdout: asyncio.StreamReader, send: Any, ended: Callable[[], None]) -> None:
    """Server's stdout → the session: one JSON-RPC message a line."""
    from mcp.shared.message import SessionMessage
    from mcp.types import JSONRPCMessage
    from pydantic import ValidationError

    try:
        async with send:
            while line := await stdout.readline():
                if not line.strip():
                    continue
                try:
                    message = JSONRPCMessage.model_validate_json(line)
                except ValidationError as exc:
                    await send.send(exc)
                    continue
                await send.send(SessionMessage(message))
    except Exception as exc:  # an over-long line, a closed stream: the connection is over
        log.debug("MCP server output ended: %s", describe(exc))
    finally:
        ended()


async def _pump_in(receive: Any, stdin: asyncio.StreamWriter, ended: Callable[[], None]) -> None:
    """The session → server's stdin."""
    try:
        async with receive:
            async for message in receive:
                text = message.message.model_dump_json(by_alias=True, exclude_none=True)
                stdin.write(text.encode("utf-8") + b"\n")
                await stdin.drain()
    except Exception as exc:  # the server closed its stdin (it died)
        log.debug("MCP server input ended: %s", describe(exc))
        ended()


async def _pump_err(stderr: asyncio.StreamReader, tail: Tail) -> None:
    with contextlib.suppress(Exception):
        while chunk := await stderr.read(65536):
            tail.add(chunk)


async def _end(process: asyncio.subprocess.Process) -> None:
    """Close the server's stdin, give it ``END_TIMEOUT`` to exit, then kill its group."""
    if process.stdin is not None:
        with contextlib.suppress(Exception):
            process.stdin.close()
    try:
        await asyncio.wait_for(process.wait(), END_TIMEOUT)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            await process.wait()


@asynccontextmanager
async def connected(
    server: McpServer, tail: Tail, ended: Callable[[], None]
) -> AsyncIterator[tuple[ClientSession, asyncio.subprocess.Process | None]]:
    """An initialised ``ClientSession`` (and the stdio server's process), closed on exit.

    ``ended`` is called when the server's output ends (it exited or closed it).
    """
    import anyio
    from mcp import ClientSession

    if server.url:
        from mcp.client.streamable_http import streamablehttp_client

        async with (
            streamablehttp_client(server.url) as (read, write, _),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session, None
        return
    process, lifeline = await spawn_stdio(server)
    assert process.stdin and process.stdout and process.stderr
    read_in, read_out = anyio.create_memory_object_stream[Any](0)
    write_in, write_out = anyio.create_memory_object_stream[Any](0)
    try:
        async with anyio.create_task_group() as pumps:
            pumps.start_soon(_pump_out, process.stdout, read_in, ended)
            pumps.start_soon(_pump_in, write_out, process.stdin, ended)
            pumps.start_soon(_pump_err, process.stderr, tail)
            try:
                async with ClientSession(read_out, write_in) as session:
                    await session.initialize()
                    yield session, process
            finally:
                pumps.cancel_scope.cancel()
    finally:
        try:
            await _end(process)
        finally:
            os.close(lifeline)
