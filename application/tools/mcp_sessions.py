"""One long-lived client session per MCP server, held by a background event loop.

The MCP SDK's client is asynchronous, and a session must be entered and left
by one task; turnlog's worker runs tool calls on plain threads. So each
process that calls MCP tools has one ``McpSessions``: a daemon thread runs an
event loop, and on that loop one task per server *holds* its session (the
server process, the pumps between its pipes and the SDK, the
``ClientSession``) until it is closed or the server goes away. Worker threads
hand coroutines to that loop and wait for them, so concurrent calls share the
session (JSON-RPC request ids keep them apart).

- A session starts on first use (listing the tools, or the first call), is
  reused by every later call, and is started again by the next use once its
  server has exited or its connection broke.
- A stdio server is spawned by ``mcp_transport.spawn_stdio`` alone, set to
  die with the thread that spawned it: the loop's, which lives as long as the
  process. A SIGKILLed worker takes its servers with it, so no call can finish
  unseen by recovery.
- A call that overruns its timeout, or that is stopped, closes the session
  (its server process is killed): the call's effect is cut off, as a command's
  would be; the next call starts the server again.
- ``close()`` (and, for pools left open, the interpreter's exit) closes every
  session: the server's stdin is closed, then its group is killed if it has
  not exited within ``END_TIMEOUT``.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from turnlog.application.tools.mcp_transport import (
    END_TIMEOUT,
    McpServer,
    Tail,
    connected,
    describe,
)
from turnlog.application.tools.port import ToolError, ToolOutcomeUnknown
from turnlog.application.tools.processes import identify
from turnlog.domain.turns import ToolProcess

if TYPE_CHECKING:
    from mcp import ClientSession

log = logging.getLogger("turnlog.mcp")

START_TIMEOUT = 30.0  # spawning, initialising and (at discovery) listing
STOP_POLL = 0.05  # how often a waiting call looks at its stop event

T = TypeVar("T")


class ServerUnavailable(Exception):
    """The server could not be started or initialised; nothing was sent to it."""


class NotSent(Exception):
    """The session ended before the request left: the call may be sent on a new one."""


# ------------------------------------------------------------------ held sessions


@dataclass
class Held:
    """A server's live session, as the loop holds it."""

    server: McpServer
    session: ClientSession
    process: ToolProcess | None  # a stdio server's identity (None: HTTP)
    done: asyncio.Event  # set when the session is over (server gone, or closing)
    gone: asyncio.Event  # set once the session has been left (its server is ended)
    task: asyncio.Task[None] | None = None
    tail: Tail = field(default_factory=Tail)

    @property
    def usable(self) -> bool:
        return not self.done.is_set()


_OPEN: weakref.WeakSet[McpSessions] = weakref.WeakSet()


@atexit.register
def _close_open_pools() -> None:
    for pool in list(_OPEN):
        pool.close()


class McpSessions:
    """The process's MCP sessions, one per server name, on a loop thread of their own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        # Touched only on the loop:
        self._held: dict[str, Held] = {}
        self._starting: dict[str, asyncio.Lock] = {}

    # ---------------------------------------------------------- from any thread

    def acquire(self, server: McpServer) -> Held:
        """The server's live session, started now if there is none (``ServerUnavailable``)."""
        return self._wait(self._acquire(server), START_TIMEOUT + END_TIMEOUT + 5)

    def run(self, work: Callable[[ClientSession], Awaitable[T]], held: Held, limit: float) -> T:
        """Run ``work(session)`` on the loop; ``TimeoutError`` after ``limit`` seconds."""

        async def on_loop() -> T:
            return await asyncio.wait_for(work(held.session), limit)

        return self._wait(on_loop(), limit + END_TIMEOUT + 5)

    def call(
        self,
        held: Held,
        remote: str,
        arguments: dict[str, Any],
        meta: dict[str, Any],
        timeout: float,
        stop: threading.Event,
        name: str,
    ) -> Any:
        """Send one tools/call on the held session; its CallToolResult.

        ``NotSent`` when the session ended before the request left;
        ``ToolOutcomeUnknown`` when it ended after; ``ToolError`` for a timeout
        or a refusal. A timeout or a stop closes the session, killing its server.
        """
        future = self._submit(self._call(held, remote, arguments, meta, timeout, name))
        finished = threading.Event()
        future.add_done_callback(lambda _: finished.set())
        deadline = time.monotonic() + timeout + END_TIMEOUT + 5
        while not finished.wait(STOP_POLL):
            if stop.is_set() or time.monotonic() > deadline:
                future.cancel()
                self._wait(self._drop(held), END_TIMEOUT + 5)
                if stop.is_set():
                    raise ToolOutcomeUnknown(f"{name}: stopped; its server process was stopped")
                raise ToolError(f"{name}: no answer within {timeout:g}s (timeout)")
        return future.result()

    def close(self) -> None:
        """Close every session (ending its server), then the loop; safe to call twice."""
        with self._lock:
            loop, thread, self._closed = self._loop, self._thread, True
            self._loop = self._thread = None
        _OPEN.discard(self)
        if loop is None or thread is None:
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._close_all(), loop).result(END_TIMEOUT + 10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        if not thread.is_alive():
            loop.close()

    def processes(self) -> dict[str, ToolProcess]:
        """The live stdio servers' identities, by server name (for tests and status)."""
        return self._wait(self._processes(), 10)

    # ---------------------------------------------------------- plumbing

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise ToolError("MCP sessions are closed: the process is stopping")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="turnlog-mcp-sessions", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
                _OPEN.add(self)
            return self._loop

    def _submit(self, work: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        try:
            loop = self._ensure_loop()
        except BaseException:
            work.close()
            raise
        return asyncio.run_coroutine_threadsafe(work, loop)

    def _wait(self, work: Coroutine[Any, Any, T], limit: float) -> T:
        future = self._submit(work)
        try:
            return future.result(limit)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no answer from the MCP sessions' loop within {limit:g}s") from None

    # ---------------------------------------------------------- on the loop

    async def _acquire(self, server: McpServer) -> Held:
        lock = self._starting.setdefault(server.name, asyncio.Lock())
        async with lock:
            held = self._held.get(server.name)
            if held is not None and held.usable:
                return held
            if held is not None:
                await self._drop(held)  # reap the ended one before starting again
            held = await self._start(server)
            self._held[server.name] = held
            return held

    async def _start(self, server: McpServer) -> Held:
        ready: asyncio.Future[Held] = asyncio.get_running_loop().create_future()
        tail = Tail()
        task = asyncio.create_task(self._hold(server, ready, tail), name=f"mcp-{server.name}")
        try:
            held = await asyncio.wait_for(asyncio.shield(ready), START_TIMEOUT)
        except TimeoutError:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            if ready.done():
                ready.exception()  # retrieved: the timeout is the cause told
            raise ServerUnavailable(
                f"{server} did not answer within {START_TIMEOUT:g}s{tail.last_line()}"
            ) from None
        except ServerUnavailable as exc:
            raise ServerUnavailable(f"{exc}{tail.last_line()}") from None
        held.task = task
        log.info(
            "%s started%s",
            server,
            f" (pid {held.process.pid})" if held.process is not None else "",
        )
        return held

    async def _hold(self, server: McpServer, ready: asyncio.Future[Held], tail: Tail) -> None:
        """Enter the session, hand it over, and keep it until it is done; then leave it."""
        done, gone = asyncio.Event(), asyncio.Event()
        try:
            async with connected(server, tail, done.set) as (session, process):
                identity = None
                if process is not None:
                    identity = identify(process.pid)
                    if identity is not None:
                        identity = ToolProcess(
                            identity.pid,
                            identity.started_at,
                            identity.host,
                            identity.boot_id,
                            server=server.name,
                        )
                ready.set_result(Held(server, session, identity, done, gone, tail=tail))
                await done.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(ServerUnavailable(f"{server} could not start: {describe(exc)}"))
            elif not isinstance(exc, asyncio.CancelledError):
                log.debug("%s session ended: %s", server, describe(exc))
            if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
                raise
        finally:
            done.set()
            gone.set()

    async def _call(
        self,
        held: Held,
        remote: str,
        arguments: dict[str, Any],
        meta: dict[str, Any],
        timeout: float,
        name: str,
    ) -> Any:
        import anyio
        from mcp.shared.exceptions import McpError
        from mcp.types import CONNECTION_CLOSED

        if not held.usable:
            raise NotSent
        call = asyncio.ensure_future(held.session.call_tool(remote, arguments, meta=meta))
        gone = asyncio.ensure_future(held.gone.wait())
        try:
            finished, _ = await asyncio.wait(
                {call, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            gone.cancel()
            if not call.done():
                call.cancel()
        if call in finished:
            try:
                return call.result()
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                held.done.set()
                raise NotSent from None  # the request never reached the pump to the server
            except McpError as exc:
                if exc.error.code == CONNECTION_CLOSED:
                    # The request was sent; whether the server acted before it went is unknown.
                    held.done.set()
                    raise ToolOutcomeUnknown(f"{held.server}: {exc.error.message}") from None
                raise ToolError(f"{name}: {exc.error.message}") from None
            except (OSError, EOFError) as exc:
                held.done.set()
                raise ToolOutcomeUnknown(
                    f"{held.server}: connection lost: {describe(exc)}"
                ) from None
        if gone in finished:
            # Its session ended (the server exited) while the request was out.
            raise ToolOutcomeUnknown(f"{held.server}: the server ended during the call")
        await self._drop(held)
        raise ToolError(
            f"{name}: no answer within {timeout:g}s (timeout); its server process was "
            "stopped (it starts again on the next call)"
        )

    async def _drop(self, held: Held) -> None:
        """End the held session (its server too) and forget it."""
        held.done.set()
        if self._held.get(held.server.name) is held:
            del self._held[held.server.name]
        if held.task is not None:
            await asyncio.gather(held.task, return_exceptions=True)

    async def _close_all(self) -> None:
        await asyncio.gather(*(self._drop(h) for h in list(self._held.values())))

    async def _processes(self) -> dict[str, ToolProcess]:
        return {
            name: held.process
            for name, held in self._held.items()
            if held.usable and held.process is not None
        }
