"""Waiting for a turn to finish, woken for its own session, with a deadline (see ``waits``)."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

from fastapi.concurrency import run_in_threadpool

from turnlog.application.sessions import Sessions
from turnlog.application.views import describe_turn
from turnlog.interface.http.state import AppState

# A turn in one of these states changes no more by itself (see sessions.ENDING_TOPICS).
FINISHED = frozenset({"completed", "failed", "interrupted", "abandoned", "cancelled"})


def turn_view(sessions: Sessions, session_id: UUID, turn_id: str) -> dict[str, Any]:
    session, turn = sessions.turn_record(session_id, turn_id)
    return describe_turn(session, turn)


async def until_finished(
    state: AppState,
    sessions: Sessions,
    session_id: UUID,
    turn_id: str,
    timeout: float,
    watching: asyncio.Event,
    *,
    read_first: bool,
) -> tuple[dict[str, Any], bool]:
    """The turn's view once it is finished (True), or at the deadline (False).

    "Finished" includes ``interrupted``: nothing more happens without an operator.
    The caller holds one of ``state.waits``'s slots and ``watching``, its watch
    of the session's endings (``state.waits.watch(..., ending_only=True)``),
    taken before the turn could end; it unwatches it. The turn is read only
    when an event that may end a turn of its session is saved by this process
    or read from the log by its follower, and first at once only with
    ``read_first`` (a turn submitted earlier, which may have ended already).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    if not read_first:
        await state.waits.wait(watching, timeout, state.draining)
    while True:
        watching.clear()  # before reading: a later ending sets it again
        view = await run_in_threadpool(turn_view, sessions, session_id, turn_id)
        if view["state"] in FINISHED:
            return view, True
        remaining = deadline - loop.time()
        if remaining <= 0 or state.draining.is_set():
            return view, False
        # Woken only by an event ending a turn of this session (saved here, or read).
        await state.waits.wait(watching, remaining, state.draining)
