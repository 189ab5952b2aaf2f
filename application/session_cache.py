"""What a process keeps of sessions between commands: their latest events, earlier turns rebuilt.

Two caches behind one lock, both plain memory of this process:

- the latest events of each session this process saved or read (a
  fast-forward of its cached object), in unbroken version order: a request
  or a turn's view rebuilt from them reads nothing back;
- the earlier (finished) turns rebuilt for a session's last request, with the
  version range they cover: a finished turn never changes, so the next
  request needs only the events after that range;
- the messages each finished turn of a session's last request said
  (``application.said``), by turn id.
"""

from __future__ import annotations

import threading
from typing import Any
from uuid import UUID

from turnlog.domain.session import Session

EARLIER_CACHE_SIZE = 64  # sessions whose earlier turns this process keeps rebuilt
KNOWN_SESSIONS = 64  # sessions whose latest events this process keeps
KNOWN_EVENTS = 64  # the latest events kept of each (a turn of some 20 tool calls)


class SessionCache:
    """The latest events and the rebuilt earlier turns of recently used sessions."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._earlier: dict[UUID, tuple[int, int, Session]] = {}
        self._known: dict[UUID, list[Any]] = {}
        self._said: dict[UUID, Any] = {}

    def clear(self) -> None:
        """Drop everything kept (the database restarted: it may hold commits it lost)."""
        with self._lock:
            self._known.clear()
            self._earlier.clear()

    def forget(self, session_id: UUID) -> None:
        """Drop everything kept of a session (it was purged)."""
        with self._lock:
            self._known.pop(session_id, None)
            self._earlier.pop(session_id, None)
            self._said.pop(session_id, None)

    def keep(self, session_id: UUID, events: list[Any]) -> None:
        """Keep the latest events of a session, saved or read here (in version order).

        They extend the kept run when they follow it; after a gap (another
        process wrote what this one has not read) they begin a new run.
        """
        with self._lock:
            kept = self._known.pop(session_id, [])  # put back last: the newest
            if kept:
                after = kept[-1].originator_version
                events = [e for e in events if e.originator_version > after]
                if events and events[0].originator_version != after + 1:
                    kept = []
            kept.extend(events)
            del kept[:-KNOWN_EVENTS]
            self._known[session_id] = kept
            while len(self._known) > KNOWN_SESSIONS:
                self._known.pop(next(iter(self._known)))

    def between(self, session_id: UUID, after: int, upto: int) -> list[Any] | None:
        """The kept events with versions ``after+1..upto``, if all of them are kept."""
        with self._lock:
            return between(self._known.get(session_id, []), after, upto)

    def take_earlier(self, session_id: UUID) -> tuple[int, int, Session] | None:
        """Take out the earlier turns kept for a session: (first, last, turns), or None.

        Taken out while in use, so that the reads that extend them hold no
        lock (every save of every session passes through ``keep``).
        """
        with self._lock:
            return self._earlier.pop(session_id, None)

    def put_earlier(self, session_id: UUID, first: int, last: int, earlier: Session) -> None:
        with self._lock:
            self._earlier[session_id] = (first, last, earlier)
            while len(self._earlier) > EARLIER_CACHE_SIZE:
                self._earlier.pop(next(iter(self._earlier)))

    def take_said(self, session_id: UUID) -> Any:
        """Take out what the finished turns of a session said (``application.said``; None: none)."""
        with self._lock:
            return self._said.pop(session_id, None)

    def put_said(self, session_id: UUID, said: Any) -> None:
        with self._lock:
            self._said[session_id] = said
            while len(self._said) > EARLIER_CACHE_SIZE:
                self._said.pop(next(iter(self._said)))


def between(events: list[Any], after: int, upto: int) -> list[Any] | None:
    """The events with versions ``after+1..upto``, if ``events`` hold all of them."""
    if after >= upto:
        return []
    chosen = [e for e in events if after < e.originator_version <= upto]
    if len(chosen) != upto - after or chosen[0].originator_version != after + 1:
        return None
    return chosen
