"""Where a reader of the log goes back to after the database restarted.

A commit that rode (``domain.durability``) is on disk within three times
``wal_writer_delay`` of its commit (PostgreSQL's bound for asynchronous
commits), or sooner, with the next commit that waits for the disk. A crash
may lose the ones younger than that, and hand their transaction ids and
positions out again. So an event read at least that long (and a margin)
before the last read ahead of the crash is on disk, and so is every event
before it in the log's order: a reader that goes back to its place then
misses nothing the restarted server holds. ``Places`` keeps the places a
reader reached, with when, for as long as that takes.
"""

from __future__ import annotations

import collections
from typing import Any

from turnlog.application.store.logorder import Place

DEFAULT_FLUSH_BOUND = 0.6  # s: three times PostgreSQL's default wal_writer_delay (200 ms)
MARGIN = 1.0  # s added to the bound: a WAL writer late under load


def flush_bound(curs: Any) -> float:
    """Seconds within which the server writes a commit that rode (3 ``wal_writer_delay``)."""
    row = curs.execute(
        "SELECT setting::int AS ms FROM pg_settings WHERE name = 'wal_writer_delay'"
    ).fetchone()
    ms = (row["ms"] if isinstance(row, dict) else row[0]) if row else None
    return 3 * ms / 1000 if ms else DEFAULT_FLUSH_BOUND


class Places:
    """The places a reader reached, each with when (monotonic), kept as long as needed."""

    def __init__(self, bound: float, first: tuple[float, Place]) -> None:
        self.keep = bound + MARGIN
        self._entries: collections.deque[tuple[float, Place]] = collections.deque([first])

    def append(self, entry: tuple[float, Place]) -> None:
        self._entries.append(entry)
        # Keep one entry older than ``keep`` before the newest: the place to go back to.
        newest = entry[0]
        while len(self._entries) > 1 and self._entries[1][0] <= newest - self.keep:
            self._entries.popleft()

    def durable(self) -> Place:
        """The newest place reached at least ``keep`` before the last one (else the oldest)."""
        newest = self._entries[-1][0]
        found = self._entries[0][1]
        for at, place in self._entries:
            if at <= newest - self.keep:
                found = place
        return found
