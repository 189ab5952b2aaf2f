"""The waits of one process on turns (``?wait=``): bounded in number, woken per session.

Every commit of the namespace notifies the process (``LogPulse``). Waking
each waiter on each notification made each rebuild its session: 600 clients
on ``?wait=60`` cut session creation from 13 to 0.9 per second. So one
follower per process reads, after each notification (and every ``fallback``
second, for a lost one), the last version of every session someone waits on
— one query — and wakes only the waiters whose session changed. The number
of concurrent waits is bounded per process like live streams: past it, 503
``too_many_waits`` with Retry-After.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from uuid import UUID

from fastapi.concurrency import run_in_threadpool

from turnlog.application.history import History
from turnlog.interface.http.pulse import LogPulse
from turnlog.interface.problems import TooManyWaits


class TurnWaits:
    """The waits of this process: a bound on how many, and one follower that wakes them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0
        self._lock = threading.Lock()
        self._waiters: dict[UUID, set[asyncio.Event]] = {}
        self._versions: dict[UUID, int | None] = {}
        self._follower: asyncio.Task[None] | None = None

    def acquire(self) -> Callable[[], None]:
        """Take a slot or raise TooManyWaits; returns the (idempotent) release."""
        with self._lock:
            if self.open >= self.limit:
                raise TooManyWaits(
                    f"all {self.limit} waits of this server are in use; retry later, or "
                    "submit without ?wait and read the turn (or follow its events)",
                    limit=self.limit,
                )
            self.open += 1
        released = False

        def release() -> None:
            nonlocal released
            with self._lock:
                if not released:
                    released = True
                    self.open -= 1

        return release

    @property
    def watching(self) -> int:
        """Waiters registered now (those between two reads included)."""
        return sum(len(events) for events in self._waiters.values())

    @property
    def followed(self) -> int:
        """Sessions whose last version the follower knows."""
        return len(self._versions)

    def watch(self, session_id: UUID) -> asyncio.Event:
        """An event set when the session may have changed since the caller's next read."""
        event = asyncio.Event()
        self._waiters.setdefault(session_id, set()).add(event)
        return event

    def unwatch(self, session_id: UUID, event: asyncio.Event) -> None:
        events = self._waiters.get(session_id)
        if events is not None:
            events.discard(event)
            if not events:
                del self._waiters[session_id]
                self._versions.pop(session_id, None)

    def follow(self, pulse: LogPulse, history: History, draining: threading.Event) -> None:
        """Start the follower unless it runs; it ends by itself when nobody waits."""
        if self._follower is None or self._follower.done():
            self._follower = asyncio.create_task(
                self._follow(pulse, history, draining), name="turnlog-waits"
            )

    async def _follow(self, pulse: LogPulse, history: History, draining: threading.Event) -> None:
        while self._waiters:
            ticket = pulse.ticket()
            if draining.is_set():
                self._wake(list(self._waiters))
            else:
                with contextlib.suppress(Exception):  # the database is down: waiters time out
                    await self._check(history)
            await pulse.wait(ticket, pulse.fallback)

    async def _check(self, history: History) -> None:
        ids = list(self._waiters)
        versions = await run_in_threadpool(history.last_versions, ids)
        changed = []
        for session_id in ids:
            version = versions.get(session_id)
            # A session seen for the first time is woken too: it may have
            # changed between its waiter's read and this check.
            if session_id not in self._versions or self._versions[session_id] != version:
                changed.append(session_id)
            self._versions[session_id] = version
        self._wake(changed)

    def _wake(self, session_ids: list[UUID]) -> None:
        for session_id in session_ids:
            for event in self._waiters.get(session_id, ()):
                event.set()
