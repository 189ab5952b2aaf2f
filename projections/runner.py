"""Keeping read models up to date: one runner thread per read model, one leader per cluster.

Each runner holds, on a dedicated connection of its own:

- a session-level advisory lock keyed by (namespace, read model): only the
  holder processes events, every other process's runner waits as a hot
  standby and takes over within ``STANDBY_INTERVAL`` of the holder dying
  (the server drops the lock with the dead connection);
- ``LISTEN`` on the namespace's channel, for low latency. The library's
  subscription has no fallback when notifications stop (a dead or silently
  partitioned listener); here every wait is bounded by ``poll_interval``,
  after which the runner reads the log anyway.

The runner reads the log in its order, below the commit horizon, and keeps
its place as a (transaction id, position) pair (``application.logorder``).
When committed events wait past the horizon (an older transaction still
runs), it looks again every ``HELD_POLL`` seconds: the transaction holding
them back may end without a notification (a client outside turnlog, a
crashed writer).

Events are applied in batches, one transaction per batch (see
``projections.view``). Any error ends the runner's leadership (its
connection closes, so the lock goes) and the runner starts again after a
backoff: a dropped connection, a conflict with another writer, a poison
event — the position only moves when a batch commits, so nothing is lost or
applied twice.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from types import TracebackType
from typing import Any

import psycopg
from psycopg import sql

from turnlog.application.database import Database, connect, lock_key
from turnlog.application.sessions import Sessions
from turnlog.application.settings import Settings
from turnlog.projections.catalog import ReadModel, read_models
from turnlog.projections.log import EventLog, create_tables, open_log
from turnlog.projections.view import fold_batch

log = logging.getLogger("turnlog.projections")

LOCK_NAME = "turnlog:projection"
STANDBY_INTERVAL = 0.5  # how often a standby tries the lock
LOCK_CHECK_INTERVAL = 1.0  # during a long catch-up, how often the lock connection is checked
MIN_BACKOFF = 0.2
MAX_BACKOFF = 5.0
HEALTHY_AFTER = 10.0  # leadership that lasted this long restarts from the minimum backoff
HELD_POLL = 0.02  # how often to look again while committed events wait past the horizon


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
        listen: bool = True,
    ) -> None:
        self.model = model
        self.state = RunnerState(model.name)
        self._events = events
        self._db = db
        self._key = projection_lock_key(namespace, model.name)
        self._stopping = stopping
        self._batch_size = batch_size
        self._poll_interval = poll_interval
        self._listen = listen
        self._thread = threading.Thread(
            target=self._run, name=f"projection-{model.name}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

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
            if self._listen:
                conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._events.channel)))
            self.state.state = "active"
            log.info("projection %s: this process is the active runner", self.model.name)
            place = view.position(self._events.application_name)
            self.state.position = place.position
            checked = time.monotonic()
            while not self._stopping.is_set():
                page = self._events.read(place, self._batch_size)
                if page.records:
                    pairs = self._events.decode(page.records)
                    place = fold_batch(view, projection, place, pairs)
                    self.state.position = place.position
                    if time.monotonic() - checked > LOCK_CHECK_INTERVAL:
                        conn.execute("SELECT 1")  # still connected, so still the lock holder
                        checked = time.monotonic()
                    if len(page) == self._batch_size or page.pending:
                        continue
                self._wait(conn, HELD_POLL if page.pending else self._poll_interval)
                checked = time.monotonic()

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
        """Until a notification, or ``timeout`` at most; raises if the connection died."""
        if self._listen:
            for _ in conn.notifies(timeout=timeout, stop_after=1):
                break
            # Drain what else arrived: one read covers them all, and a backlog
            # left behind would grow without bound and make every wait return
            # at once (a busy loop on empty reads).
            for _ in conn.notifies(timeout=0):
                pass
        else:
            conn.execute("SELECT 1")
            self._stopping.wait(timeout)


class ProjectionSupervisor:
    """Runs read-model runners in this process: ``start()``, then ``stop()``.

    Connections: one pool for reading the log and writing the views (its
    sizes from ``settings.pool_size`` / ``pool_max_overflow``; shared with
    ``sessions`` when one is given), plus one dedicated connection per read
    model for its lock and LISTEN.
    """

    def __init__(
        self,
        settings: Settings,
        db: Database,
        names: str | Iterable[str] | None = None,
        *,
        sessions: Sessions | None = None,
        batch_size: int = 500,
        poll_interval: float = 0.5,
        listen: bool = True,
    ) -> None:
        self.settings = settings
        self.db = db
        self.models = read_models(names)
        self._sessions = sessions
        self._batch_size = batch_size
        self._poll_interval = poll_interval
        self._listen = listen
        self._stopping = threading.Event()
        self._runners: list[ReadModelRunner] = []
        self._events: EventLog | None = None

    def start(self) -> None:
        """Prepare the tables and start one runner thread per read model."""
        if self._runners:
            raise RuntimeError("the projection supervisor is already running")
        if self._sessions is not None:
            self._events = EventLog(self._sessions)
        else:
            self._events = open_log(self.db, self.settings)
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
                listen=self._listen,
            )
            for model in self.models
        ]
        for runner in self._runners:
            runner.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every runner (each releases its lock) and close what this supervisor opened."""
        self._stopping.set()
        deadline = time.monotonic() + timeout
        for runner in self._runners:
            runner.join(max(0.0, deadline - time.monotonic()))
        self._runners = []
        if self._events is not None and self._sessions is None:
            self._events.close()
        self._events = None

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
