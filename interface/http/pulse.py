"""Wake-ups on new events: one LISTEN connection per process, shared by every waiter.

Writers send ``NOTIFY`` on the namespace's own channel after their commits
(``application.recorder``), so the notification arrives once the events are
committed. Waiters (``?wait=``, live event streams) take the current
``asyncio.Event`` *before* they read the database, then wait on it: a commit
whose notification comes after their read always wakes them. A notification
can be lost (a writer killed between its commit and its ``NOTIFY``), so
waiters also poll at ``fallback`` seconds, as they do while the LISTEN
connection is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import psycopg
from psycopg import sql

log = logging.getLogger("turnlog.http")


class LogPulse:
    """An ``asyncio.Event`` replaced on every notification of new events."""

    def __init__(self, fallback: float = 1.0) -> None:
        self.fallback = fallback
        self._event = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.listening = False

    def ticket(self) -> asyncio.Event:
        """Take before reading; it is set by the first notification after this call."""
        return self._event

    async def wait(self, ticket: asyncio.Event, timeout: float) -> bool:
        """Wait for ``ticket`` (or the fallback poll, or ``timeout``); True when notified."""
        limit = max(0.0, min(timeout, self.fallback))
        try:
            await asyncio.wait_for(ticket.wait(), limit)
        except TimeoutError:
            return False
        return True

    def pulse(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()

    def start(self, conninfo: str, channel: str) -> None:
        """LISTEN on ``channel`` (the namespace's: ``recorder.channel_name``)."""
        if self._task is None:
            self._task = asyncio.create_task(self._listen(conninfo, channel), name="turnlog-pulse")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.pulse()  # release every waiter so it re-checks and sees the shutdown

    async def _listen(self, conninfo: str, channel: str) -> None:
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                    self.listening = True
                    async for _ in conn.notifies():
                        self.pulse()
            except psycopg.Error as exc:
                log.warning("LISTEN connection lost (%s); waiters poll until it is back", exc)
            finally:
                self.listening = False
            await asyncio.sleep(self.fallback)
