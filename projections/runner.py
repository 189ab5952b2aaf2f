"""Keeping read models up to date: one runner thread per process, one leader per read model.

For each read model, the runner holds a dedicated connection of its own, and on it:

- a session-level advisory lock keyed by (namespace, read model): only the
  holder processes that read model's events, every other process's runner
  stands by for it and takes over within ``STANDBY_INTERVAL`` of the holder
  dying (the server drops the lock with the dead connection). A process may
  lead one read model and stand by for another;
- nothing else: it does not listen for notifications itself. The process's
  one follower (``application.store.follower``) reads each new page of the log
  once and hands it to the runner, which folds the pages that continue from
  where it is, and reads the log itself only to catch up (at start, or after
  falling behind). Every wait is bounded by ``poll_interval``, after which
  the runner reads the log anyway; the wait also ends the moment a lock
  connection breaks.

The runner reads the log in its order, below the commit horizon, and keeps
each read model's place as a (transaction id, position) pair
(``application.store.logorder``). When committed events wait past the horizon (an
older transaction still runs), it (or the follower) looks again every
``HELD_POLL`` seconds: the transaction holding them back may end without a
notification (a client outside turnlog, a crashed writer).

Events are applied in batches: one transaction per batch for every read
model the process leads (see ``projections.view``), so a turn's commits cost
one or two commits of the read models, not that many per read model. An
error ends one read model's leadership (its connection closes, so the lock
goes) and it starts again after a backoff: a dropped connection, a conflict
with another writer, a poison event. When the shared transaction fails, each
read model's part is tried alone, so a poison event stops only the read
model that cannot fold it. A place only moves when a batch commits, so
nothing is lost or applied twice.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import select
import threading
import time
from collections.abc import Iterable
from typing import Any

import psycopg

from turnlog.application.errors import DatabaseUnavailable
from turnlog.application.store.database import Database, connect
from turnlog.application.store.follower import LogFollower
from turnlog.application.store.logorder import LogPage, Place
from turnlog.projections.catalog import ReadModel
from turnlog.projections.leadership import (
    HEALTHY_AFTER,
    MAX_BACKOFF,
    MIN_BACKOFF,
    STANDBY_INTERVAL,
    RunnerState,
    _Lead,
    runner_label,
)
from turnlog.projections.log import EventLog
from turnlog.projections.view import Fold, fold_together

log = logging.getLogger("turnlog.projections")

LOCK_CHECK_INTERVAL = 1.0  # during a long catch-up, how often the lock connection is checked
# How long a runner lets the follower's pages gather before folding them: a
# turn's six commits, a few milliseconds apart, become one or two batches (one
# transaction each) instead of six. It bounds the read models' added lag.
GATHER = 0.015
# The same under a steady stream of pages (the last fold ended less than this
# ago): each batch holds several turns, so a session's row is written once for
# them, in fewer transactions, which the runner's share of CPU keeps up with.
GATHER_BUSY = 0.04
HELD_POLL = 0.02  # how often to look again while committed events wait past the horizon
QUEUED_PAGES = 64  # pages from the follower a runner keeps; past it, it reads the log itself


def gather_window(first: float, folded_at: float) -> float:
    """How long pages gather after the first (arrived at ``first``; last fold ended ``folded_at``).

    ``GATHER`` after a pause; ``GATHER_BUSY`` while pages stream in.
    """
    return GATHER_BUSY if first - folded_at < GATHER_BUSY else GATHER


class ReadModelRunner:
    """Keeps this process's read models up to date, one thread for all of them.

    Leadership stays per read model (each has its own lock connection, so
    another process may lead one read model and stand by for the others), but
    the models this thread leads fold each page together: one transaction,
    one commit, for all of them. If that transaction fails, each model's part
    is tried alone, so a poison event stops only the read model it poisons.
    """

    def __init__(
        self,
        models: Iterable[ReadModel],
        events: EventLog,
        db: Database,
        namespace: str,
        stopping: threading.Event,
        *,
        batch_size: int,
        poll_interval: float,
        follower: LogFollower | None = None,
    ) -> None:
        self._leads = [_Lead(model, namespace) for model in models]
        self._events = events
        self._db = db
        self._stopping = stopping
        self._batch_size = batch_size
        self._poll_interval = poll_interval
        self._follower = follower
        self.own_reads = 0  # reads of the log by this runner itself (to catch up)
        self.commits = 0  # transactions that folded events (one or more read models each)
        self._pages: collections.deque[LogPage] = collections.deque(maxlen=QUEUED_PAGES)
        self._pages_lock = threading.Lock()
        self._first_at = 0.0  # when the oldest page waiting to be folded arrived
        self._folded_at = 0.0  # when the last fold of the follower's pages ended
        self._checked = 0.0  # when the lock connections were last known to be alive
        self._closed = False
        # A pipe the follower rings after handing a page over: the wait
        # selects on it and on the lock connections, so it ends at once on either.
        self._bell_r, self._bell_w = os.pipe()
        os.set_blocking(self._bell_r, False)
        os.set_blocking(self._bell_w, False)
        if follower is not None:
            follower.subscribe(self._take)
        self._thread = threading.Thread(target=self._run, name="projections", daemon=True)

    @property
    def states(self) -> list[RunnerState]:
        return [lead.state for lead in self._leads]

    def start(self) -> None:
        """Try every read model's lock now, then follow on the thread.

        When this returns, each read model is led, stood by for or retrying:
        readiness (``/readyz``) is true from the start, not after a race.
        """
        self._take_leads()
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

    # ------------------------------------------------------------ the loop

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                try:
                    self._step()
                except Exception as exc:  # not one read model's: all of them start again
                    for lead in self._leads:
                        if lead.leading:
                            self._fail(lead, exc)
        finally:
            for lead in self._leads:
                self._let_go(lead)
                lead.state.state = "stopped"

    def _step(self) -> None:
        self._take_leads()
        active = [lead for lead in self._leads if lead.leading]
        if not active:
            self._stopping.wait(self._until_next_try(self._poll_interval))
            return
        # The read models at the front fold the follower's pages; one behind
        # them (just led again, after a rebuild or a failure) catches up by
        # reads of its own, a batch per step, so that it holds no one back.
        front = max(lead.through for lead in active)
        group = [lead for lead in active if lead.through == front]
        behind = [lead for lead in active if lead.through < front]
        try:
            if behind:
                self._catch_up(behind, front)
            self._gather(group)
            page = self._next_page(front)
        except (psycopg.Error, DatabaseUnavailable) as exc:  # no lock is at fault: keep them
            log.warning("projections: reading the log failed (%s); trying again", exc)
            self._stopping.wait(MIN_BACKOFF)
            return
        if page is None:  # nothing new since the follower's last page
            if not behind:
                self._wait(active, self._poll_interval)
            return
        self._fold(group, page)
        self._folded_at = time.monotonic()
        for lead in group:
            lead.through = max(lead.through, page.next, lead.place)
        if time.monotonic() - self._checked > LOCK_CHECK_INTERVAL:
            self._check(active, every=True)  # a long catch-up: still connected, so still leading
        if len(page) >= self._batch_size or self._follower is not None or behind:
            return  # more to read, or the follower's next page to wait for
        self._wait(active, HELD_POLL if page.pending else self._poll_interval)

    def _catch_up(self, behind: list[_Lead], front: Place) -> None:
        """One batch for the read models furthest behind, read up to ``front`` at most."""
        through = min(lead.through for lead in behind)
        last = [lead for lead in behind if lead.through == through]
        page = self._read(through, stop=front)
        self._fold(last, page)
        for lead in last:
            lead.through = max(lead.through, page.next, lead.place)

    def _take_leads(self) -> None:
        """Try the lock of each read model not led, when its turn to try has come."""
        now = time.monotonic()
        for lead in self._leads:
            if lead.leading or now < lead.next_try:
                continue
            try:
                self._try_lead(lead, now)
            except Exception as exc:
                self._fail(lead, exc)

    def _try_lead(self, lead: _Lead, now: float) -> None:
        name = lead.model.name
        if lead.conn is None:
            lead.since = now
            lead.conn = connect(self._db, application_name=runner_label(name))
        row = lead.conn.execute("SELECT pg_try_advisory_lock(%s)", (lead.key,)).fetchone()
        if not (row and row[0]):
            if lead.state.state != "standby":
                log.info("projection %s: standing by (another runner holds it)", name)
            lead.state.state = "standby"
            lead.next_try = time.monotonic() + STANDBY_INTERVAL
            return
        view = lead.model.postgres_view(self._events.datastore)
        lead.place = lead.through = view.position(self._events.application_name)
        lead.view, lead.projection = view, lead.model.projection(view)
        lead.state.state = "active"
        lead.state.position = lead.place.position
        log.info("projection %s: this process is the active runner", name)

    def _fold(self, active: list[_Lead], page: LogPage) -> None:
        """Fold the page's new events into every model led, in one transaction if it can."""
        start = min(lead.place for lead in active)
        records = [r for r in page.records if r[0] > start]
        if not records:
            return
        pairs = list(zip(records, self._events.decode(records), strict=True))
        folds = []
        for lead in active:
            assert lead.view is not None and lead.projection is not None
            mine = [pair for record, pair in pairs if record[0] > lead.place]
            if mine:
                folds.append((lead, Fold(lead.view, lead.projection, lead.place, mine)))
        if not folds:
            return
        try:
            places = fold_together(self._events.datastore, [fold for _, fold in folds], page.epoch)
        except Exception as exc:
            if len(folds) == 1:
                self._fail(folds[0][0], exc)
                return
            log.info("projections: folding together failed (%s); folding one at a time", exc)
            for lead, fold in folds:
                try:
                    self._moved(lead, fold_together(self._events.datastore, [fold], page.epoch)[0])
                    self.commits += 1
                except Exception as alone:
                    self._fail(lead, alone)
            return
        self.commits += 1
        for (lead, _), place in zip(folds, places, strict=True):
            self._moved(lead, place)

    @staticmethod
    def _moved(lead: _Lead, place: Place) -> None:
        lead.place = place
        lead.state.position = place.position

    def _fail(self, lead: _Lead, exc: Exception) -> None:
        """One read model's leadership ends (its lock goes with its connection); retry later."""
        now = time.monotonic()
        if now - lead.since > HEALTHY_AFTER:
            lead.backoff = MIN_BACKOFF
        lead.state.state = "retrying"
        lead.state.restarts += 1
        lead.state.last_error = f"{type(exc).__name__}: {exc}"
        log.warning(
            "projection %s stopped (%s); restarting in %.1fs",
            lead.model.name,
            lead.state.last_error,
            lead.backoff,
        )
        self._let_go(lead)
        # The pages kept may be from before a restart of the database: the read model
        # reads from its stored place itself when it leads again.
        with self._pages_lock:
            self._pages.clear()
        lead.next_try = now + lead.backoff
        lead.backoff = min(lead.backoff * 2, MAX_BACKOFF)

    @staticmethod
    def _let_go(lead: _Lead) -> None:
        lead.view = lead.projection = None
        if lead.conn is not None:
            with contextlib.suppress(Exception):
                lead.conn.close()
            lead.conn = None

    # ------------------------------------------------------------ pages

    def _gather(self, active: list[_Lead]) -> None:
        """Let the follower's pages gather for up to ``GATHER`` after the first one arrived.

        Up to ``GATHER_BUSY`` when it came less than that after the last fold
        (pages stream in): the first page after a pause is folded soon. The
        wait ends early only when a lock connection's socket turns readable
        (then the next check raises); the bell is left for later.
        """
        with self._pages_lock:
            first = self._first_at if self._pages else None
        if first is None:
            return
        remaining = first + gather_window(first, self._folded_at) - time.monotonic()
        if remaining > 0:
            select.select(self._sockets(active), [], [], remaining)

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
                if last is not None and page.epoch != last.epoch:
                    break  # read in another epoch of the server: folded on its own
                self._pages.popleft()
                records += [r for r in page.records if r[0] > reached]
                reached, last = page.next, page
            gap = bool(self._pages) and self._pages[0].after > reached
        if last is not None:
            return LogPage(records, last.horizon, last.pending, through, reached, last.epoch)
        if gap or self._follower.place > through:
            return self._read(through)  # catching up
        return None

    def _read(self, through: Place, stop: Place | None = None) -> LogPage:
        self.own_reads += 1
        return self._events.read(through, self._batch_size, stop)

    # ------------------------------------------------------------ waiting

    @staticmethod
    def _sockets(active: list[_Lead]) -> list[int]:
        return [lead.conn.fileno() for lead in active if lead.conn is not None]

    def _until_next_try(self, timeout: float) -> float:
        """``timeout``, cut short to the next lock attempt of a read model not led."""
        tries = [lead.next_try for lead in self._leads if not lead.leading]
        if tries:
            timeout = min(timeout, max(0.0, min(tries) - time.monotonic()))
        return timeout

    def _wait(self, active: list[_Lead], timeout: float) -> None:
        """Until the follower rings, or ``timeout`` at most; a dead lock connection ends a lead."""
        sockets = self._sockets(active)
        ready, _, _ = select.select([self._bell_r, *sockets], [], [], self._until_next_try(timeout))
        rung = self._bell_r in ready
        if rung:
            with contextlib.suppress(BlockingIOError):
                while os.read(self._bell_r, 4096):
                    pass
        # A dropped connection makes its socket readable at once: then (and
        # after a quiet wait) a round trip tells whether it is still
        # connected, so still the lock holder. A bell with quiet sockets needs none.
        self._check(active, every=not rung, readable=set(ready))

    def _check(self, active: list[_Lead], *, every: bool, readable: set[int] | None = None) -> None:
        for lead in active:
            if lead.conn is None or not (every or lead.conn.fileno() in (readable or ())):
                continue
            try:
                lead.conn.execute("SELECT 1")
            except Exception as exc:
                self._fail(lead, exc)
        self._checked = time.monotonic()
