"""The one ear of a process: one LISTEN connection, one read of the log's tail per wake-up.

Writers send ``NOTIFY`` on the namespace's channel after their commits
(``application.store.recorder``). One follower per process listens, and on each
notification (and every ``poll_interval`` seconds, for a lost one or while
the LISTEN connection is down) reads the new events once — in the log's
order, below the commit horizon (``application.store.logorder``) — and hands the
page to every subscriber in the process: the read-model runners (which
fold it), the worker (sessions with new work), the HTTP waits and live
streams (sessions that changed). While committed events wait past the
horizon it looks again every ``HELD_POLL`` seconds.

The readers in a hurry (the worker, a ``?wait``) need not wait for that
read: another process's notification carries hints (``recorder.Hint``: a
turn to take, a turn's end, by session), handed to the hint subscribers (the
news feed, ``application.news``) the moment it arrives; this process's own
saves told the feed already. So a wake-up whose every notification was told so
(ours, or with hints) waits up to ``GATHER`` for more before it reads, and
one read covers a burst of commits; a notification that tells nothing (no
hints: an older writer, or too many for one payload) is read at once. When
no subscriber needs pages promptly (a process with a worker and no read
models nor live streams: the hints and its own saves offer it every turn),
a told wake-up waits for the next poll, and the page is a safety net.

Subscribers run on the follower's thread and must not block: they note
what they were told and wake their own thread. ``changed`` is a signal for
threads that wait for any new event (the runners).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql

from turnlog.application.errors import ApplicationError
from turnlog.application.sessions import Sessions
from turnlog.application.store import epoch as store_epoch
from turnlog.application.store import logorder, restart
from turnlog.application.store.database import Database, connect
from turnlog.application.store.logorder import LogPage, Place
from turnlog.application.store.recorder import Hint, log_channel, notice_of

log = logging.getLogger("turnlog.follower")

HELD_POLL = 0.02  # how often to look again while committed events wait past the horizon
STOP_CHECK = 0.5  # the longest a wait for notifications goes without looking for a stop
# How long a wake-up whose notifications were all told already (our own writes,
# or another process's with hints) waits for more before reading: their urgent
# readers (the worker, a ``?wait``) know; a burst of commits then costs one read.
GATHER = 0.01
BATCH = 1000

Subscriber = Callable[[LogPage], None]
HintSubscriber = Callable[[Sequence[Hint]], None]


class Signal:
    """A counter threads wait on: take a ticket before reading, wait until it moves."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._count = 0

    def ticket(self) -> int:
        with self._cond:
            return self._count

    def fire(self) -> None:
        with self._cond:
            self._count += 1
            self._cond.notify_all()

    def wait(self, ticket: int, timeout: float) -> bool:
        """True when fired since ``ticket`` was taken; False after ``timeout``."""
        with self._cond:
            return self._cond.wait_for(lambda: self._count != ticket, timeout)


def sessions_of(page: LogPage, topics: frozenset[str] | None = None) -> list[UUID]:
    """The sessions with events in ``page`` (of ``topics`` only, when given), in log order."""
    seen: dict[UUID, None] = {}
    for _, notification in page.records:
        if topics is None or notification.topic in topics:
            seen.setdefault(UUID(str(notification.originator_id)), None)
    return list(seen)


class LogFollower:
    """Follows the namespace's log for this process; ``start()``, then ``stop()``."""

    def __init__(self, sessions: Sessions, db: Database, *, poll_interval: float = 1.0) -> None:
        recorder: Any = sessions.recorder
        self.channel = log_channel(recorder)
        self._datastore = recorder.datastore
        self._table = logorder.table(self._datastore.schema, recorder.events_table_name)
        self._db = db
        self.poll_interval = poll_interval
        self.changed = Signal()  # fired after every read that found events
        self.reads = 0  # reads of the log's tail
        self.rows_read = 0  # events those reads returned (each event once)
        self.listening = False
        self.notifications = 0  # received (a burst drained at once counts each)
        self.gathered = 0  # wake-ups told already (ours, or hinted) that waited for more
        self.hinted = 0  # notifications of other processes whose hints were handed over
        self._origin = recorder.notifier.origin  # names this process in its own payloads
        self.place = Place.start()  # where the next read begins
        self._epoch = store_epoch.of(self._datastore)
        self._page_epoch: Any = None  # the server's epoch of the last page read
        self._flush_bound = restart.DEFAULT_FLUSH_BOUND
        self._read_at = restart.Places(self._flush_bound, (time.monotonic(), self.place))
        self.rewinds = 0  # times the place went back after the database restarted
        self._subscribers: list[Subscriber] = []
        # Whether a subscriber needs pages soon after the commits: always (True),
        # never (False), or as a function says now.
        self._prompt: dict[Subscriber, Callable[[], bool] | bool] = {}
        self._hint_subscribers: list[HintSubscriber] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def subscribe(self, subscriber: Subscriber, prompt: Callable[[], bool] | bool = True) -> None:
        """Call ``subscriber`` (on the follower's thread) with every page of new events.

        ``prompt``: whether it needs each page soon after the commits (or a
        function that says whether it does now). A subscriber that is told of
        what it needs some other way (hints, its own saves) takes the pages as
        a safety net, and alone lets told wake-ups wait for the next poll.
        """
        self._subscribers.append(subscriber)
        self._prompt[subscriber] = prompt

    def unsubscribe(self, subscriber: Subscriber) -> None:
        if subscriber in self._subscribers:
            self._subscribers.remove(subscriber)
            self._prompt.pop(subscriber, None)

    def _in_a_hurry(self) -> bool | None:
        """Whether a subscriber needs the pages soon after the commits now.

        None: no, nor can one until a subscriber comes or goes.
        """
        prompts = list(self._prompt.values())
        if any(p is True or (callable(p) and p()) for p in prompts):
            return True
        return False if any(callable(p) for p in prompts) else None

    def subscribe_hints(self, subscriber: HintSubscriber) -> None:
        """Call ``subscriber`` (on the follower's thread) with another process's hints.

        As each notification arrives, before the log is read; the page with
        the same events follows.
        """
        self._hint_subscribers.append(subscriber)

    def unsubscribe_hints(self, subscriber: HintSubscriber) -> None:
        if subscriber in self._hint_subscribers:
            self._hint_subscribers.remove(subscriber)

    def start(self) -> None:
        """Begin at the log's end now (below the horizon); later events are followed."""
        if self._thread is not None:
            return
        with self._datastore.get_connection() as conn, conn.cursor() as curs:
            self.place = Place.below(logorder.current_horizon(curs))
            self._flush_bound = restart.flush_bound(curs)
        self._read_at = restart.Places(self._flush_bound, (time.monotonic(), self.place))
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="turnlog-follower", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self.changed.fire()  # release every waiter so it re-checks and sees the stop

    def _run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        pending = False
        try:
            while not self._stop.is_set():
                if conn is None:
                    conn = self._listen()
                timeout = HELD_POLL if pending else self.poll_interval
                if conn is not None and not self._wait(conn, timeout):
                    conn.close()
                    conn = None
                elif conn is None:
                    self._stop.wait(timeout)
                if self._stop.is_set():
                    return
                try:
                    pending = self.read()
                except Exception:
                    log.warning("reading the log's tail failed; trying again", exc_info=True)
                    pending = False
        finally:
            self.listening = False
            if conn is not None:
                conn.close()

    def _listen(self) -> psycopg.Connection[Any] | None:
        try:
            label = f"turnlog-follower {socket.gethostname()[:24]}:{os.getpid()}"[:63]
            conn = connect(self._db, application_name=label)
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
        except (psycopg.Error, ApplicationError) as exc:
            log.warning("LISTEN connection lost (%s); polling until it is back", exc)
            self.listening = False
            return None
        self.listening = True
        return conn

    def _wait(self, conn: psycopg.Connection[Any], timeout: float) -> bool:
        """Until the tail should be read, ``timeout`` at the most; False when the connection broke.

        A notification that tells nothing ends the wait at once. Once one was
        told (from this process's own writes, or with hints, handed over as
        they come), the wait goes on ``GATHER`` for more, or to ``timeout``
        while no subscriber is in a hurry (looking again every ``GATHER``
        while one may be soon). A stop ends it within ``STOP_CHECK``.
        """
        deadline = time.monotonic() + timeout
        gathered_until: float | None = None  # set by the first told notification
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                hurry = None if gathered_until is None else self._in_a_hurry()
                if gathered_until is None or hurry is None:
                    until = deadline
                elif hurry:
                    until = min(deadline, gathered_until)
                else:
                    until = min(deadline, now + GATHER)
                if now >= until:
                    return True
                wait = min(until - now, STOP_CHECK)
                notifications = list(conn.notifies(timeout=wait, stop_after=1))
                # Drain what else arrived: one read covers them all.
                notifications += conn.notifies(timeout=0)
                if not notifications:
                    continue
                if not self._take(notifications):
                    return True
                if gathered_until is None:
                    gathered_until = time.monotonic() + GATHER
                    self.gathered += 1
            return True
        except psycopg.Error as exc:
            log.warning("LISTEN connection lost (%s); polling until it is back", exc)
            self.listening = False
            return False

    def _take(self, notifications: list[psycopg.Notify]) -> bool:
        """Count ``notifications`` and hand their hints over; whether each was told.

        True when there were some and each came from this process's own writes
        or carried hints; False when there were none or one tells nothing.
        """
        told = bool(notifications)
        for notification in notifications:
            self.notifications += 1
            notice = notice_of(notification.payload)
            if notice is None:
                told = False
                continue
            if notice.origin == self._origin:
                continue  # ours: the saves told this process's readers already
            self.hinted += 1
            if notice.hints:
                for subscriber in list(self._hint_subscribers):
                    try:
                        subscriber(notice.hints)
                    except Exception:
                        log.exception("a follower's hint subscriber failed")
        return told

    def _restarted(self, page: LogPage) -> bool:
        """Whether the page was read from a server that restarted since the last read.

        Then events read before it may be gone (commits that rode) and their
        places given out again: the page is dropped and the place goes back to
        one read long enough before the restart to be on disk
        (``restart.Places``); subscribers may see events again.
        """
        before, self._page_epoch = self._page_epoch, page.epoch
        if before is None or page.epoch is None or page.epoch == before:
            return False
        back = self._read_at.durable()
        log.warning(
            "the database restarted: reading the log again from position %d (was at %d)",
            back.position,
            self.place.position,
        )
        self._epoch.learned(page.epoch)
        self.place = min(self.place, back)
        self._read_at = restart.Places(self._flush_bound, (time.monotonic(), self.place))
        self.rewinds += 1
        return True

    def read(self) -> bool:
        """Read the tail once (in batches while full) and fan it out; True when rows wait."""
        while True:
            with self._datastore.get_connection() as conn, conn.cursor() as curs:
                page = logorder.read_log(curs, self._table, self.place, BATCH)
            self.reads += 1
            if self._restarted(page):
                continue
            if page.records or page.next > self.place:
                self.rows_read += len(page.records)
                for subscriber in list(self._subscribers):
                    try:
                        subscriber(page)
                    except Exception:
                        log.exception("a follower's subscriber failed")
                # Moved only now: a reader comparing its place with ours never
                # sees a page as read before it was handed over.
                self.place = page.next
                self._read_at.append((time.monotonic(), self.place))
                self.changed.fire()
            if len(page.records) < BATCH:
                return page.pending
