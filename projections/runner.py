"""Keeping read models up to date: one runner thread per read model, one leader per cluster.

Each runner holds, on a dedicated connection of its own:

- a session-level advisory lock keyed by (namespace, read model): only the
  holder processes events, every other process's runner waits as a hot
  standby and takes over within ``STANDBY_INTERVAL`` of the holder dying
  (the server drops the lock with the dead connection);
- nothing else: it does not listen for notifications itself. The process's
  one follower (``application.follower``) reads each new page of the log
  once and hands it to every runner; a runner folds the pages that continue
  from where it is, and reads the log itself only to catch up (at start, or
  after falling behind). Every wait is bounded by ``poll_interval``, after
  which the runner reads the log anyway; the wait also ends the moment the
  lock connection breaks.

The runner reads the log in its order, below the commit horizon, and keeps
its place as a (transaction id, position) pair (``application.logorder``).
When committed events wait past the horizon (an older transaction still
runs), it (or the follower) looks again every ``HELD_POLL`` seconds: the
transaction holding them back may end without a notification (a client
outside turnlog, a crashed writer).

Events are applied in batches, one transaction per batch (see
``projections.view``). Any error ends the runner's leadership (its
connection closes, so the lock goes) and the runner starts again after a
backoff: a dropped connection, a conflict with another writer, a poison
event — the position only moves when a batch commits, so nothing is lost or
applied twice.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from types import TracebackType
from typing import Any

import psycopg

from turnlog.application.database import Database, connect, lock_key
from turnlog.application.follower import LogFollower
from turnlog.application.logorder import LogPage, Place
from turnlog.application.sessions import Sessions
from turnlog.application.settings import Settings
from turnlog.projections.catalog import ReadModel, read_models
from turnlog.projections.log import EventLog, create_tables
from turnlog.projections.view import fold_batch

log = logging.getLogger("turnlog.projections")

LOCK_NAME = "turnlog:projection"
STANDBY_INTERVAL = 0.5  # how often a standby tries the lock
LOCK_CHECK_INTERVAL = 1.0  # during a long catch-up, how often the lock connection is checked
MIN_BACKOFF = 0.2
MAX_BACKOFF = 5.0
HEALTHY_AFTER = 10.0  # leadership that lasted this long restarts from the minimum backoff
# How long a runner lets the follower's pages gather before folding them: a
# turn's six commits, a few milliseconds apart, become one or two batches (one
# transaction each) instead of six. It bounds the read models' added lag.
GATHER = 0.015
HELD_POLL = 0.02  # how often to look again while committed events wait past the horizon
QUEUED_PAGES = 64  # pages from the follower a runner keeps; past it, it reads the log itself
# Events decoded once for every runner of the process (they fold the same pages).
KEEP_DECODED = 4096


def projection_lock_key(namespace: str, name: str) -> int:
    return lock_key(LOCK_NAME, namespace, name)


def runner_label(name: str) -> str:
    """The lock connection's application_name: what status shows as the holder."""
    return f"turnlog-projection {name} {socket.gethostname()[:24]}:{os.getpid()}"[:63]


@dataclass
class RunnerState:
    """What one runner of this process is doing."""

    name: str
    state: str = "starting"  # standby | active | retrying | stopped
    position: int = 0  # of the last event processed
    restarts: int = 0
    last_error: str = ""


class ReadModelRunner:
    """Keeps one read model up to date while this process leads it."""

    def __init__(
        self,
        model: ReadModel,
        events: EventLog,
        db: Database,
        namespace: str,
        stopping: threading.Event,
        *,
        batch_size: int,
        poll_interval: float,
        follower: LogFollower | None = None,
    ) -> None:
        self.model = model
        self.state = RunnerState(model.name)
        self._events = events
        self._db = db
        self._key = projection_lock_key(namespace, model.name)
        self._stopping = stopping
        self._batch_size = batch_size
        self._poll_interval = poll_interval
        self._follower = follower
        self.own_reads = 0  # reads of the log by this runner itself (to catch up)
        self._pages: collections.deque[LogPage] = collections.deque(maxlen=QUEUED_PAGES)
        self._pages_lock = threading.Lock()
        self._first_at = 0.0  # when the oldest page waiting to be folded arrived
        self._closed = False
        # A pipe the follower rings after handing a page over: the wait
        # selects on it and on the lock connection, so it ends at once on either.
        self._bell_r, self._bell_w = os.pipe()
        os.set_blocking(self._bell_r, False)
        os.set_blocking(self._bell_w, False)
        if follower is not None:
            follower.subscribe(self._take)
        self._thread = threading.Thread(
            target=self._run, name=f"projection-{model.name}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def close(self) -> None:
        """Stop taking pages from the follower; once the thread is done, close the bell."""
        if self._follower is not None:
            self._follower.unsubscribe(self._take)
        with self._pages_lock:
            if self._closed or self._thread.is_alive():
                return
            self._closed = True
            os.close(self._bell_r)
            os.close(self._bell_w)

    def _take(self, page: LogPage) -> None:
        """A page the follower read (on its thread): keep it and ring."""
        with self._pages_lock:
            if self._closed:
                return
            if not self._pages:
                self._first_at = time.monotonic()
            self._pages.append(page)
            with contextlib.suppress(BlockingIOError):  # full: rung already
                os.write(self._bell_w, b"!")

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        backoff = MIN_BACKOFF
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                self._lead()
            except Exception as exc:
                if time.monotonic() - started > HEALTHY_AFTER:
                    backoff = MIN_BACKOFF
                self.state.state = "retrying"
                self.state.restarts += 1
                self.state.last_error = f"{type(exc).__name__}: {exc}"
                log.warning(
                    "projection %s stopped (%s); restarting in %.1fs",
                    self.model.name,
                    self.state.last_error,
                    backoff,
                )
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)
        self.state.state = "stopped"

    def _lead(self) -> None:
        """Take the lock (or wait for it), then follow the log until stopped or broken."""
        with connect(self._db, application_name=runner_label(self.model.name)) as conn:
            if not self._acquire(conn):
                return
            view = self.model.postgres_view(self._events.datastore)
            projection = self.model.projection(view)
            self.state.state = "active"
            log.info("projection %s: this process is the active runner", self.model.name)
            place = view.position(self._events.application_name)
            through = place  # the log is read up to here (place: the last event folded)
            self.state.position = place.position
            checked = time.monotonic()
            while not self._stopping.is_set():
                self._gather(conn)
                page = self._next_page(through)
                if page is None:  # nothing new since the follower's last page
                    self._wait(conn, self._poll_interval)
                    checked = time.monotonic()
                    continue
                records = [r for r in page.records if r[0] > place]
                if records:
                    pairs = self._events.decode(records)
                    place = fold_batch(view, projection, place, pairs)
                    self.state.position = place.position
                    if time.monotonic() - checked > LOCK_CHECK_INTERVAL:
                        conn.execute("SELECT 1")  # still connected, so still the lock holder
                        checked = time.monotonic()
                through = max(through, page.next, place)
                if len(page) >= self._batch_size or self._follower is not None:
                    continue  # more to read, or the follower's next page to wait for
                self._wait(conn, HELD_POLL if page.pending else self._poll_interval)
                checked = time.monotonic()

    def _gather(self, conn: psycopg.Connection[Any]) -> None:
        """Let the follower's pages gather for up to ``GATHER`` after the first one arrived.

        The wait ends early only when the lock connection's socket turns
        readable (then the next check raises); the bell is left for later.
        """
        with self._pages_lock:
            first = self._first_at if self._pages else None
        if first is None:
            return
        remaining = first + GATHER - time.monotonic()
        if remaining > 0:
            select.select([conn.fileno()], [], [], remaining)

    def _next_page(self, through: Place) -> LogPage | None:
        """The follower's pages that continue from ``through``; else a read of our own.

        None when the follower has handed over everything up to ``through``:
        there is nothing new to read.
        """
        if self._follower is None:
            return self._read(through)
        records: list[Any] = []
        reached = through
        last: LogPage | None = None
        with self._pages_lock:
            while self._pages and len(records) < self._batch_size:
                page = self._pages[0]
                if page.next <= reached:
                    self._pages.popleft()  # read already
                    continue
                if page.after > reached:
                    break  # a gap: pages were dropped, or we started behind
                self._pages.popleft()
                records += [r for r in page.records if r[0] > reached]
                reached, last = page.next, page
            gap = bool(self._pages) and self._pages[0].after > reached
        if last is not None:
            return LogPage(records, last.horizon, last.pending, through, reached)
        if gap or self._follower.place > through:
            return self._read(through)  # catching up
        return None

    def _read(self, through: Place) -> LogPage:
        self.own_reads += 1
        return self._events.read(through, self._batch_size)

    def _acquire(self, conn: psycopg.Connection[Any]) -> bool:
        while not self._stopping.is_set():
            row = conn.execute("SELECT pg_try_advisory_lock(%s)", (self._key,)).fetchone()
            if row and row[0]:
                return True
            if self.state.state != "standby":
                log.info("projection %s: standing by (another runner holds it)", self.model.name)
            self.state.state = "standby"
            self._stopping.wait(STANDBY_INTERVAL)
        return False

    def _wait(self, conn: psycopg.Connection[Any], timeout: float) -> None:
        """Until the follower rings, or ``timeout`` at most; raises if the connection died."""
        ready, _, _ = select.select([self._bell_r, conn.fileno()], [], [], timeout)
        if self._bell_r in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(self._bell_r, 4096):
                    pass
        if conn.fileno() in ready or self._bell_r not in ready:
            # A dropped connection makes its socket readable at once: then (and
            # after a quiet wait) this raises unless still connected, so still
            # the lock holder. A bell with a quiet socket needs no round trip.
            conn.execute("SELECT 1")


class ProjectionSupervisor:
    """Runs read-model runners in this process: ``start()``, then ``stop()``.

    Connections: one pool for reading the log and writing the views (its
    sizes from ``settings.pool_size`` / ``pool_max_overflow``; shared with
    the process's ``sessions`` application), plus one dedicated connection per read
    model for its lock. New events come from the process's ``follower``;
    without one (or with ``listen=False``) the runners poll the log.
    """

    def __init__(
        self,
        settings: Settings,
        db: Database,
        names: str | Iterable[str] | None = None,
        *,
        sessions: Sessions,
        batch_size: int = 500,
        poll_interval: float = 0.5,
        listen: bool = True,
        follower: LogFollower | None = None,
    ) -> None:
        self.settings = settings
        self.db = db
        self.models = read_models(names)
        self._sessions = sessions
        self._batch_size = batch_size
        self._poll_interval = poll_interval
        self._follower = follower if listen else None
        self._stopping = threading.Event()
        self._runners: list[ReadModelRunner] = []
        self._events: EventLog | None = None

    def start(self) -> None:
        """Prepare the tables and start one runner thread per read model."""
        if self._runners:
            raise RuntimeError("the projection supervisor is already running")
        self._events = EventLog(self._sessions, keep_decoded=KEEP_DECODED)
        try:
            create_tables(self.db, self._events, self.models)
        except BaseException:
            self.stop()
            raise
        self._stopping.clear()
        self._runners = [
            ReadModelRunner(
                model,
                self._events,
                self.db,
                self.settings.namespace,
                self._stopping,
                batch_size=self._batch_size,
                poll_interval=self._poll_interval,
                follower=self._follower,
            )
            for model in self.models
        ]
        for runner in self._runners:
            runner.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every runner (each releases its lock and its connection)."""
        self._stopping.set()
        deadline = time.monotonic() + timeout
        for runner in self._runners:
            runner.join(max(0.0, deadline - time.monotonic()))
            runner.close()
        self._runners = []
        self._events = None

    def own_reads(self) -> int:
        """How often this process's runners read the log themselves (not the follower's pages)."""
        return sum(runner.own_reads for runner in self._runners)

    def runners(self) -> list[dict[str, Any]]:
        """This process's runners: name, state, position, restarts, last error."""
        return [asdict(runner.state) for runner in self._runners]

    def __enter__(self) -> ProjectionSupervisor:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
