"""Retention: closed sessions older than ``TURNLOG_RETENTION_DAYS`` are purged.

A session is due when it is closed and its last event is older than the
cut-off. Candidates come from the sessions read model (closed, last
activity before the cut-off); each is checked again on the session itself
before it is purged, so a read model that lags never purges a session too
early. ``run`` purges them one by one (``application.purge``), after
finishing any purge a process left halfway.

``RetentionJob`` runs it in the background of ``serve``, every
``interval`` seconds, in ONE process of the namespace at a time: the one
that holds the retention lock (a session-level advisory lock on a
connection of its own, as leases are). When that process dies its
connection goes, and another process's job takes the lock on its next try.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg

from turnlog.application.errors import ApplicationError, SessionNotFound, SessionPurged
from turnlog.application.purge import Purger
from turnlog.application.store.database import Database, connect, lock_key
from turnlog.domain import errors as domain_errors

log = logging.getLogger("turnlog.retention")

ACTOR = "retention"
BATCH = 100  # candidates read per round trip
INTERVAL = 300.0  # seconds between runs of the background job

# (cut-off, limit) -> ids of closed sessions whose last activity is before the cut-off
Candidates = Callable[[datetime, int], Sequence[UUID]]


@dataclass(frozen=True)
class Due:
    """A session retention purges (or, in a dry run, would purge)."""

    session_id: UUID
    title: str
    last_activity_at: datetime
    events: int | None = None  # the events it had (None in a dry run)
    error: str = ""  # why it was not purged (empty: it was, or would be)

    def as_dict(self) -> dict[str, Any]:
        return {
            "session_id": str(self.session_id),
            "title": self.title,
            "last_activity_at": self.last_activity_at.isoformat(),
            "events": self.events,
            "error": self.error,
        }


@dataclass
class Retention:
    """The policy of one namespace: purge sessions closed more than ``days`` days ago."""

    days: int
    purger: Purger
    candidates: Candidates

    def cutoff(self, now: datetime | None = None) -> datetime:
        return (now or datetime.now(UTC)) - timedelta(days=self.days)

    def due(self, now: datetime | None = None, limit: int = 10_000) -> list[Due]:
        """Sessions due now, each checked on the session itself (its last event, closed)."""
        cutoff = self.cutoff(now)
        found: list[Due] = []
        for session_id in self.candidates(cutoff, limit):
            try:
                session = self.purger.sessions.get_session(session_id)
            except (SessionNotFound, SessionPurged):
                continue  # the read model lags behind a purge
            last = session.modified_on
            if session.closed and last < cutoff:
                found.append(Due(session_id, session.title, last))
        return found

    def run(
        self,
        *,
        dry_run: bool = False,
        progress: Callable[[Due, int, int], None] = lambda d, i, n: None,
        now: datetime | None = None,
    ) -> list[Due]:
        """Purge every session due (``dry_run``: only list them); ``progress`` after each."""
        if not dry_run:
            self.purger.resume_unfinished()
        due = self.due(now)
        reason = f"retention: closed and inactive for more than {self.days} days"
        done: list[Due] = []
        for index, item in enumerate(due, 1):
            if not dry_run:
                try:
                    record = self.purger.purge(item.session_id, reason, ACTOR)
                    item = Due(item.session_id, item.title, item.last_activity_at, record.events)
                except (ApplicationError, domain_errors.DomainError) as exc:
                    item = Due(item.session_id, item.title, item.last_activity_at, None, str(exc))
            done.append(item)
            progress(item, index, len(due))
        return done


@dataclass
class RetentionStats:
    """What this process's job did (for the metrics)."""

    runs: int = 0
    failed_runs: int = 0
    sessions: int = 0
    events: int = 0
    refused: int = 0
    leading: bool = False
    last_run_at: float = 0.0  # unix time of the last run's end (0: none yet)


@dataclass
class RetentionJob:
    """Runs ``retention`` every ``interval`` seconds while it holds the namespace's lock."""

    retention: Retention
    db: Database
    namespace: str
    interval: float = INTERVAL
    stats: RetentionStats = field(default_factory=RetentionStats)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _conn: psycopg.Connection[Any] | None = None

    @property
    def key(self) -> int:
        return lock_key("turnlog:retention", self.namespace)

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._loop, name="turnlog-retention", daemon=True
            )
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self._let_go()

    def _loop(self) -> None:
        while not self._stop.is_set():
            if self._lead():
                self.run_once()
            self._stop.wait(self.interval)

    def _lead(self) -> bool:
        """Hold the retention lock (taken now, or kept since); False while another holds it."""
        try:
            if self._conn is not None and not self._conn.closed:
                self._conn.execute("SELECT 1")
                return True
        except psycopg.Error:
            self._let_go()
        try:
            conn = connect(self.db, application_name=f"turnlog-retention {self.namespace}"[:63])
            row = conn.execute("SELECT pg_try_advisory_lock(%s)", (self.key,)).fetchone()
        except (psycopg.Error, ApplicationError) as exc:
            log.warning("retention: cannot reach the database (%s); trying again later", exc)
            self.stats.leading = False
            return False
        if not (row and row[0]):
            conn.close()
            self.stats.leading = False
            return False
        self._conn = conn
        self.stats.leading = True
        return True

    def _let_go(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self.stats.leading = False

    def run_once(self) -> list[Due]:
        """One run now; never raises (a failed run is logged and counted)."""
        try:
            done = self.retention.run()
        except Exception:
            self.stats.failed_runs += 1
            log.exception("retention run failed; trying again in %.0fs", self.interval)
            return []
        purged = [d for d in done if not d.error]
        self.stats.runs += 1
        self.stats.sessions += len(purged)
        self.stats.events += sum(d.events or 0 for d in purged)
        self.stats.refused += len(done) - len(purged)
        self.stats.last_run_at = datetime.now(UTC).timestamp()
        if done:
            log.info(
                "retention purged %d session(s) closed over %d days ago (%d refused)",
                len(purged),
                self.retention.days,
                len(done) - len(purged),
            )
        return done
