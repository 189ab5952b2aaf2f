"""The waits of one process on turns (``?wait=``): bounded in number, woken per session.

Waking each waiter on each commit made each rebuild its session: 600
clients on ``?wait=60`` cut session creation from 13 to 0.9 per second. So
the process's news feed (``application.news``) tells this object which
sessions changed, and only their waiters (``?wait=`` and live event streams)
wake to read again. A ``?wait`` on a turn wakes only for events that end a
turn (``store.topics.ENDING_TOPICS``), not for each step of it: a turn's six
commits cost its waiter one read after the first, not six. The follower
behind the feed also polls, so a lost notification costs latency, never a
wake-up. A turn's end comes sooner than the follower's read of the log: from
the save, when this process's own worker ended it, or from the hints of the
notification another process sent; the feed tells it once, from whichever
came first. The number of concurrent waits
is bounded per process like live streams: past it, 503 ``too_many_waits``
with Retry-After.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from uuid import UUID

from turnlog.application.news import News, NewsFeed
from turnlog.application.store.topics import CHANGE_MARK, ENDING_MARK
from turnlog.interface.problems import TooManyWaits

# How often a waiter woken by nothing looks whether the server is draining.
DRAIN_CHECK = 1.0


class Slots:
    """A bound on how many of one kind of long request this process serves at once."""

    def __init__(self, limit: int, refusal: Callable[[], Exception]) -> None:
        self.limit = limit
        self.open = 0
        self._refusal = refusal
        self._lock = threading.Lock()

    def acquire(self) -> Callable[[], None]:
        """Take a slot or raise the refusal; returns the (idempotent) release."""
        with self._lock:
            if self.open >= self.limit:
                raise self._refusal()
            self.open += 1
        released = False

        def release() -> None:
            nonlocal released
            with self._lock:
                if not released:
                    released = True
                    self.open -= 1

        return release


class TurnWaits:
    """The waits of this process: a bound on how many, woken per session by the follower."""

    def __init__(self, limit: int) -> None:
        self.slots = Slots(
            limit,
            lambda: TooManyWaits(
                f"all {limit} waits of this server are in use; retry later, or "
                "submit without ?wait and read the turn (or follow its events)",
                limit=limit,
            ),
        )
        self._waiters: dict[UUID, set[asyncio.Event]] = {}
        # Waiters woken by ENDING_TOPICS events only (``?wait``: hints tell them at once).
        self._ending_only: set[asyncio.Event] = set()
        self._streams = 0  # waiters woken by any change (live streams)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._news: NewsFeed | None = None
        self.woken = 0  # waiters woken so far, each to read its session again

    def attach(self, news: NewsFeed, loop: asyncio.AbstractEventLoop) -> None:
        """Be told by the news feed of turns' ends and changes; wake-ups run on ``loop``."""
        self.detach()
        self._loop = loop
        self._news = news
        # Changes are needed soon only by waiters of any change (live streams).
        news.subscribe(self._on_news, ENDING_MARK + CHANGE_MARK, prompt=self._streaming)

    def detach(self) -> None:
        if self._news is not None:
            self._news.unsubscribe(self._on_news)
            self._news = None

    def _on_news(self, news: Sequence[News]) -> None:
        """On the source's thread: hand the watched sessions with news to the loop."""
        watched = list(dict.fromkeys(n.session_id for n in news if n.session_id in self._waiters))
        if watched and self._loop is not None and not self._loop.is_closed():
            ended = {n.session_id for n in news if n.mark == ENDING_MARK}
            self._loop.call_soon_threadsafe(self._wake, watched, ended)

    def _streaming(self) -> bool:
        """Whether a waiter is woken by any change (a live stream), not only by endings."""
        return self._streams > 0

    def wake_all(self) -> None:
        """Wake every waiter (on the loop): they re-check, and see a shutdown."""
        self._wake(list(self._waiters), set(self._waiters))

    def acquire(self) -> Callable[[], None]:
        """Take a slot or raise TooManyWaits; returns the (idempotent) release."""
        return self.slots.acquire()

    @property
    def open(self) -> int:
        """Waits holding a slot now."""
        return self.slots.open

    @property
    def watching(self) -> int:
        """Waiters registered now (those between two reads included)."""
        return sum(len(events) for events in self._waiters.values())

    @property
    def followed(self) -> int:
        """Sessions someone waits on."""
        return len(self._waiters)

    def watch(self, session_id: UUID, ending_only: bool = False) -> asyncio.Event:
        """An event set when the session may have changed since the caller's next read.

        ``ending_only``: set only when a turn of the session may have ended.
        """
        event = asyncio.Event()
        self._waiters.setdefault(session_id, set()).add(event)
        if ending_only:
            self._ending_only.add(event)
        else:
            self._streams += 1
        return event

    def unwatch(self, session_id: UUID, event: asyncio.Event) -> None:
        events = self._waiters.get(session_id)
        if events is not None and event in events:
            events.discard(event)
            if event in self._ending_only:
                self._ending_only.discard(event)
            else:
                self._streams -= 1
            if not events:
                del self._waiters[session_id]

    async def wait(self, event: asyncio.Event, timeout: float, draining: threading.Event) -> bool:
        """Until ``event`` is set (True), ``timeout`` passes or the server drains (False)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not draining.is_set():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(event.wait(), min(remaining, DRAIN_CHECK))
            except TimeoutError:
                continue
            return True
        return False

    def _wake(self, session_ids: list[UUID], ended: set[UUID]) -> None:
        for session_id in session_ids:
            for event in self._waiters.get(session_id, ()):
                if (session_id in ended or event not in self._ending_only) and not event.is_set():
                    event.set()
                    self.woken += 1
