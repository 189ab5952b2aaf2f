"""The sessions this process wrote last, kept as they were saved: a command's start, no read.

A command loads the session, decides, saves. When the last save of that
session was this process's own, the load would read back only what the
process already knows. So after each commit of its writes the process keeps
a private copy of the session at the saved version (the saved events applied
to the copy it kept, or, when it kept none at the version before, a copy of
the object saved), and a command that is given no session object starts
from a copy of it instead of reading the stream.

The copy may be stale: another process may have written since. Nothing
relies on it being fresh. A save from a stale copy loses the race on the
stream's version (``IntegrityError``) and the command decides again on a
fresh load, as after any lost race; a decision that refuses or records
nothing from a copy is taken again on a fresh load too (``Sessions.update``),
so what a command returns without writing always rests on the stored state.

To keep those failed attempts rare, news of another process's write (the
follower's hints and pages, ``application.news``) drops the copy at once.
A process without a follower (a one-process runtime) hears of none: a write
by another process then costs the next command one lost race.

A copy carries the server's epoch of its save, so a save from a copy kept
across a restart of the database is refused (``store.epoch``); learning of a
restart drops every copy.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from turnlog.application.news import News
from turnlog.application.store.topics import PURGE_MARK
from turnlog.domain.session import Session

KEPT_SESSIONS = 64  # sessions of which this process keeps a copy
TOLD_SESSIONS = 100_000  # sessions whose latest news version is remembered (then forgotten)
NEWS_MARKS = "wecp"  # every kind of news: each names a session's version (or its purge)


class WrittenCopies:
    """Private copies of the sessions this process saved last, at their saved versions."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._copies: dict[UUID, Session] = {}
        # session -> the highest version news told of (a copy below it is stale).
        self._told: dict[UUID, int] = {}
        self._epochs: dict[UUID, Any] = {}  # the server's epoch each copy was saved in
        self.taken = 0  # commands started from a copy
        self.dropped = 0  # copies dropped on news of another process's write

    def take(self, session_id: UUID) -> tuple[Session, Any] | None:
        """A copy of the session as this process last saved it, with the server's epoch then."""
        with self._lock:
            kept = self._copies.get(session_id)
            if kept is None:
                return None
            self.taken += 1
            return copy.deepcopy(kept), self._epochs.get(session_id)

    def clear(self) -> None:
        """Drop every copy (the database restarted: a copy may hold a commit it lost)."""
        with self._lock:
            self._copies.clear()
            self._epochs.clear()

    def saved(self, session: Session, events: Sequence[Any], epoch: Any = None) -> None:
        """``events`` of ``session`` have just committed (on the saving thread), in ``epoch``."""
        if not events:
            return
        first = events[0].originator_version
        with self._lock:
            self._epochs[session.id] = epoch
            kept: Any = self._copies.pop(session.id, None)
            if self._told.get(session.id, 0) > session.version:
                return  # another process has written since: no copy is current
            if kept is not None and kept.version == first - 1:
                for event in events:  # the copy shares the events' values, as caches do
                    kept = event.mutate(kept)
            else:
                kept = copy.deepcopy(session)
            self._copies[session.id] = kept
            while len(self._copies) > KEPT_SESSIONS:
                self._copies.pop(next(iter(self._copies)))

    def forget(self, session_id: UUID) -> None:
        with self._lock:
            self._copies.pop(session_id, None)

    def told(self, news: Sequence[News]) -> None:
        """News of sessions (a ``NewsFeed`` listener): drop the copies it makes stale."""
        with self._lock:
            if len(self._told) > TOLD_SESSIONS:
                self._told.clear()
            for piece in news:
                sid = piece.session_id
                self._told[sid] = max(piece.version, self._told.get(sid, 0))
                kept = self._copies.get(sid)
                if kept is None:
                    continue
                if piece.mark == PURGE_MARK or piece.version > kept.version:
                    del self._copies[sid]
                    self.dropped += 1
