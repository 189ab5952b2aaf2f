"""Reply deltas on a live event stream: ``event: delta`` frames between the stored events.

A delta frame has no ``id``, so ``Last-Event-ID`` keeps naming the last
stored event and resuming is unaffected; it is sent only to streams open
while the reply streams in this process (``application.providers.reply_deltas``) and
never replayed. Its data is one JSON object: ``session_id``, ``turn_id``,
``step``, ``offset`` (characters of the reply before this piece; 0 again
means the reply started over) and ``text``.

The stored events keep their own reader (``streams.follow``); this module
only merges its frames with the session's deltas into one stream. A delta is
published before its reply is saved, and both paths end in one FIFO queue,
so every delta of a step comes before that step's ``ModelReplied``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from uuid import UUID

from turnlog.application.providers.reply_deltas import DeltaHub, ReplyDelta

# Frames read ahead for a slow reader. Stored events wait for room (the reader
# of the log is held back); a delta that finds no room is dropped: the stored
# reply is whole anyway, and the offsets show the gap.
QUEUE_LIMIT = 256


def delta_frame(delta: ReplyDelta) -> bytes:
    data = json.dumps(
        {
            "session_id": str(delta.session_id),
            "turn_id": delta.turn_id,
            "step": delta.step,
            "offset": delta.offset,
            "text": delta.text,
        },
        ensure_ascii=False,
    )
    return f"event: delta\ndata: {data}\n\n".encode()


async def with_deltas(
    events: AsyncIterator[bytes], hub: DeltaHub | None, session_id: UUID
) -> AsyncIterator[bytes]:
    """The frames of ``events`` with the session's live deltas in between."""
    if hub is None:
        async for frame in events:
            yield frame
        return
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes | None] = asyncio.Queue(QUEUE_LIMIT)
    failed: list[Exception] = []

    def put_delta(frame: bytes) -> None:  # on the loop
        if not queue.full():
            queue.put_nowait(frame)

    def publish(delta: ReplyDelta) -> None:  # on the worker's thread
        with contextlib.suppress(RuntimeError):  # the loop is closed: no one reads
            loop.call_soon_threadsafe(put_delta, delta_frame(delta))

    async def pump() -> None:
        try:
            async for frame in events:
                await queue.put(frame)
        except Exception as exc:  # handed to the reader, raised there
            failed.append(exc)
        finally:
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                await aclose()
        await queue.put(None)

    unsubscribe = hub.subscribe(session_id, publish)
    task = asyncio.create_task(pump(), name="turnlog-stream-events")
    try:
        while (item := await queue.get()) is not None:
            yield item
        if failed:
            raise failed[0]
    finally:
        unsubscribe()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
