"""A process's news: what it must act on, each piece once, whichever source told it first.

News of a session reaches a process three ways: its own saves (told the
moment they commit, on the saving thread), another process's notification
hints (``recorder.Hint``, on the follower's thread as they arrive), and the
follower's pages of the log (every event, a little later). A piece of news
is a kind (``store.topics``: work to take, a turn's end, a change) of a
session at a version; the feed hands each piece to each subscriber once,
from whichever source brought it first, and drops it when another source
brings it again. So a consumer (the worker, the HTTP waits) subscribes once
and needs no bookkeeping of its own.

Listeners run on the thread of the source and must be quick and must not
raise: they note what they were told and wake their own thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from uuid import UUID

from turnlog.application.store.logorder import LogPage
from turnlog.application.store.recorder import Hint
from turnlog.application.store.topics import CHANGE_MARK, marks_of

log = logging.getLogger("turnlog.news")

# Sessions whose latest news the feed remembers; past it, it forgets them all,
# and at most one piece of each may then be delivered twice (consumers' actions
# on news are idempotent: an offer, a wake-up to read again).
REMEMBERED = 100_000


@dataclass(frozen=True)
class News:
    """A session has news of one kind (a ``store.topics`` letter) up to ``version``."""

    session_id: UUID
    mark: str
    version: int


Listener = Callable[[Sequence[News]], None]


class Follower(Protocol):
    """What the feed needs of the process's log follower (``store.follower``)."""

    def subscribe(
        self, subscriber: Callable[[LogPage], None], prompt: Callable[[], bool] | bool = True
    ) -> None: ...

    def unsubscribe(self, subscriber: Callable[[LogPage], None]) -> None: ...

    def subscribe_hints(self, subscriber: Callable[[Sequence[Hint]], None]) -> None: ...

    def unsubscribe_hints(self, subscriber: Callable[[Sequence[Hint]], None]) -> None: ...


@dataclass
class _Subscription:
    listener: Listener
    marks: str
    prompt: Callable[[], bool] | bool


class NewsFeed:
    """The one feed of a process: sources call ``saved``, ``hints`` and ``page``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscriptions: list[_Subscription] = []
        # (session, kind) -> the highest version delivered of that kind.
        self._delivered: dict[tuple[UUID, str], int] = {}
        # session -> the highest version the follower's pages told (every event up to it).
        self._read: dict[UUID, int] = {}
        self._follower: Follower | None = None
        self.delivered = 0  # pieces handed over (each counted once per subscriber)
        self.dropped = 0  # pieces a second source brought again

    # ------------------------------------------------------------ consumers

    def subscribe(
        self, listener: Listener, marks: str, prompt: Callable[[], bool] | bool = False
    ) -> None:
        """Call ``listener`` with each new piece of news of the kinds in ``marks``.

        ``prompt``: whether the listener needs changes told by the log's pages
        soon after their commits (a live stream), or a function that says
        whether it does now; work and endings come sooner by saves and hints.
        """
        with self._lock:
            self._subscriptions.append(_Subscription(listener, marks, prompt))

    def unsubscribe(self, listener: Listener) -> None:
        with self._lock:
            self._subscriptions = [s for s in self._subscriptions if s.listener != listener]

    # -------------------------------------------------------------- sources

    def attach(self, follower: Follower) -> None:
        """Take the follower's hints and pages (one follower per process)."""
        self.detach()
        self._follower = follower
        follower.subscribe(self.page, prompt=self._in_a_hurry)
        follower.subscribe_hints(self.hints)

    def detach(self) -> None:
        if self._follower is not None:
            self._follower.unsubscribe(self.page)
            self._follower.unsubscribe_hints(self.hints)
            self._follower = None

    def saved(self, session_id: UUID, events: Sequence[Any]) -> None:
        """This process's save of ``events`` committed (on the saving thread)."""
        news: dict[tuple[UUID, str], int] = {}
        for event in events:
            _add(news, session_id, marks_of(type(event).TOPIC), event.originator_version)
        self._deliver(news, source="save")

    def hints(self, hints: Sequence[Hint]) -> None:
        """Another process's notification arrived with these hints (on the follower's thread)."""
        news: dict[tuple[UUID, str], int] = {}
        for hint in hints:
            _add(news, hint.session_id, hint.marks, hint.version)
        self._deliver(news, source="hint")

    def page(self, page: LogPage) -> None:
        """The follower read these events (on its thread)."""
        news: dict[tuple[UUID, str], int] = {}
        for _, notification in page.records:
            session_id = UUID(str(notification.originator_id))
            _add(news, session_id, marks_of(notification.topic), notification.originator_version)
        self._deliver(news, source="page")

    # -------------------------------------------------------------- inside

    def _in_a_hurry(self) -> bool:
        with self._lock:
            subscriptions = list(self._subscriptions)
        return any(
            CHANGE_MARK in s.marks and (s.prompt() if callable(s.prompt) else s.prompt)
            for s in subscriptions
        )

    def _deliver(self, news: dict[tuple[UUID, str], int], source: str) -> None:
        """Hand each piece not delivered before to the subscribers of its kind.

        A hint's version is the latest of its marked saves, whatever their
        kind: one that a page has told already (every event up to it) is not
        news, whatever the kind's own version was.
        """
        if not news:
            return
        with self._lock:
            if len(self._delivered) > REMEMBERED:
                self._delivered.clear()
                self._read.clear()
            fresh = []
            for (session_id, mark), version in news.items():
                if source == "hint" and version <= self._read.get(session_id, 0):
                    self.dropped += 1
                    continue
                if source == "page":
                    self._read[session_id] = max(version, self._read.get(session_id, 0))
                if version > self._delivered.get((session_id, mark), 0):
                    self._delivered[(session_id, mark)] = version
                    fresh.append(News(session_id, mark, version))
                else:
                    self.dropped += 1
            subscriptions = list(self._subscriptions)
        if not fresh:
            return
        for subscription in subscriptions:
            told = [n for n in fresh if n.mark in subscription.marks]
            if not told:
                continue
            self.delivered += len(told)
            try:
                subscription.listener(told)
            except Exception:
                log.exception("a news listener failed")


def _add(news: dict[tuple[UUID, str], int], session_id: UUID, marks: str, version: int) -> None:
    """Note news of each kind in ``marks`` at ``version``: per session and kind, the latest.

    A hint's version is the latest of its session's marked saves, whatever
    their kind, so it may name a later version than a kind's own event: that
    only makes the piece count as delivered further on, and every kind asks
    its consumer to read the session again, which then sees the later events.
    """
    for mark in marks:
        key = (session_id, mark)
        news[key] = max(version, news.get(key, 0))
