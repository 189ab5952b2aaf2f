"""Live event streams (server-sent events) and the bound on how many are open.

A stream reads the session's events after the client's last seen version,
sends each as ``id: <version>`` / ``event: <type>`` / ``data: <json>``, then
waits for the next notification of new events. ``Last-Event-ID`` (the
version) resumes exactly after the last event received: versions are dense
per session, so nothing is lost or repeated. A comment line every
``heartbeat`` seconds keeps proxies from closing an idle stream and lets
the server notice a client that went away.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from uuid import UUID

from fastapi.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from turnlog.application.store.history import History, RecordedEvent
from turnlog.interface.http.schemas import EventOut
from turnlog.interface.http.waits import Slots, TurnWaits
from turnlog.interface.problems import TooManyStreams

BATCH = 500


class StreamSlots(Slots):
    """A bound on open event streams in this process."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            limit,
            lambda: TooManyStreams(
                f"all {limit} live event streams of this server are in use; "
                "retry later or read pages without text/event-stream",
                limit=limit,
            ),
        )


class EventStreamResponse(StreamingResponse):
    """A streaming response that gives its slot back however the stream ends."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[bytes], release: Callable[[], None]) -> None:
        super().__init__(
            content,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


def sse_frame(event: RecordedEvent) -> bytes:
    # The same JSON as in a page of events, on one line.
    data = EventOut.model_validate(event, from_attributes=True).model_dump_json()
    return f"id: {event.version}\nevent: {event.type}\ndata: {data}\n\n".encode()


async def follow(
    request: Request,
    history: History,
    session_id: UUID,
    after: int,
    waits: TurnWaits,
    heartbeat: float,
    draining: threading.Event,
) -> AsyncIterator[bytes]:
    """Yield the session's events after version ``after``, then live ones, until told to stop.

    The session is read again only when the process's follower reads an
    event of it (``waits``), or for the heartbeat; a heartbeat that finds no
    event of it any more (the session was purged) ends the stream.
    """
    loop_time = asyncio.get_running_loop().time
    last = after
    quiet_since = loop_time()
    yield b": turnlog event stream\nretry: 2000\n\n"
    woken = waits.watch(session_id)  # before reading: a later event always wakes us
    try:
        while not draining.is_set():
            woken.clear()
            events: list[RecordedEvent] = await run_in_threadpool(
                history.events, session_id, last, BATCH
            )
            for event in events:
                yield sse_frame(event)
                last = event.version
            if len(events) == BATCH:
                continue
            now = loop_time()
            if events:
                quiet_since = now
            elif now - quiet_since >= heartbeat:
                if await run_in_threadpool(history.last_version, session_id) is None:
                    return  # purged: a client that reconnects is answered 410
                yield b": heartbeat\n\n"
                quiet_since = now
            if await request.is_disconnected():
                return
            await waits.wait(woken, max(0.0, heartbeat - (now - quiet_since)), draining)
    finally:
        waits.unwatch(session_id, woken)
