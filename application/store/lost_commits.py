"""A save whose COMMIT got no answer: settled by reading the stream again, never guessed.

A connection lost while an insert (or its ``COMMIT``) was on the wire leaves
the writer not knowing whether its events are stored: the server may have
committed and died before answering, or a failover may have promoted a
standby that did or did not receive the commit. The recorder raises
``CommitOutcomeUnknown`` (an ``OperationalError``, so every caller that does
not settle it treats it as the database being unavailable), carrying the
stored events it sent. ``settle`` then reads the session's events at those
versions from the server as it is now (the new primary after a failover,
through the pool) and compares them with what was sent, byte for byte:

- all there: the save happened; their log positions are returned;
- none there: it did not; the same events are inserted again (optimistic
  concurrency still guards them: a writer that took those versions
  meanwhile makes it a conflict);
- another writer's events at those versions: ``IntegrityError``, as a lost
  optimistic-concurrency race (the caller reloads and decides again).

Until the server can be read it waits (``PATIENCE``), except for callers that
fail fast (the HTTP API: ``DatabaseUnavailable``, a 503 the client retries,
with its idempotency key). ``counts`` says how often each case occurred in
this process.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import psycopg
from eventsourcing.persistence import IntegrityError, StoredEvent
from eventsourcing.persistence import OperationalError as PersistenceOperationalError
from psycopg import sql

from turnlog.application.errors import ApplicationError
from turnlog.application.store.pool import fails_fast

log = logging.getLogger("turnlog.recorder")

# The keywords a save passes through the library to the recorder: its commit may ride;
# the epoch its session object was read in (``store.epoch``).
RIDES = "turnlog_rides"
EPOCH = "turnlog_epoch"

PATIENCE = 60.0  # seconds a patient writer waits to read the stream again
INTERVAL = 0.5  # seconds between attempts while the server cannot be read

# How often each outcome was settled in this process (a figure for tests).
counts: Counter[str] = Counter()
_counts_lock = threading.Lock()


class CommitOutcomeUnknown(PersistenceOperationalError):
    """The connection was lost after the save was sent: stored or not is unknown."""

    def __init__(
        self, detail: str, events: Sequence[StoredEvent], options: dict[str, Any] | None = None
    ) -> None:
        super().__init__(detail)
        self.events = list(events)
        self.options = dict(options or {})  # the save's (``RIDES``, ``EPOCH``)


def unanswered(exc: BaseException) -> bool:
    """Whether ``exc``, raised after a statement was sent, leaves its outcome unknown.

    The server answered an error for the statement (a constraint, a lock
    timeout …): it failed as a whole, nothing is unknown. No answer (the
    connection broke: no SQLSTATE) or the server ending the session
    (connection exceptions, class 08; a shutdown or crash, 57P…: a session
    ended while waiting for a synchronous standby has committed locally)
    leaves it unknown. A cancelled statement (57014) was refused as a whole.
    """
    cause = exc if isinstance(exc, psycopg.Error) else exc.__cause__
    if not isinstance(cause, psycopg.OperationalError):
        return False
    if isinstance(cause, psycopg.errors.PipelineAborted):
        return False  # an earlier statement of the pipeline failed and was reported
    state = cause.sqlstate
    return state is None or state[:2] == "08" or state.startswith("57P")


def save(app: Any, aggregate: Any, rides: bool = False, epoch: Any = None) -> int:
    """``app.save(aggregate)``: the last event's log position; an unanswered commit settled.

    ``rides``: the save may be lost in a crash of the database (``domain.durability``),
    so its commit does not wait for the disk. ``epoch``: the server's epoch the
    aggregate was read in (``store.epoch``); None: any.
    """
    try:
        options: dict[str, Any] = {EPOCH: epoch}
        if rides:
            options[RIDES] = True
        return int(app.save(aggregate, **options)[-1].notification.id)
    except CommitOutcomeUnknown as lost:
        return settle(app.recorder, lost)[-1]


def settle(recorder: Any, lost: CommitOutcomeUnknown) -> list[int]:
    """The log positions of ``lost.events``, stored once (see the module doc)."""
    with _counts_lock:
        counts["unanswered"] += 1
    log.warning(
        "a commit got no answer (%s): reading session %s's stream again",
        lost,
        lost.events[0].originator_id,
    )
    deadline = time.monotonic() + PATIENCE
    while True:
        try:
            return _settle_once(recorder, lost)
        except (PersistenceOperationalError, psycopg.OperationalError, ApplicationError):
            if fails_fast() or time.monotonic() >= deadline:
                raise
            time.sleep(INTERVAL)


def _settle_once(recorder: Any, lost: CommitOutcomeUnknown) -> list[int]:
    sent = {e.originator_version: e for e in lost.events}
    first = lost.events[0]
    stored = _stored(recorder, first.originator_id, min(sent), max(sent))
    ours = {
        v: position
        for v, (position, topic, state) in stored.items()
        if v in sent and topic == sent[v].topic and state == bytes(sent[v].state)
    }
    if len(ours) == len(sent):
        _settled("stored", first)
        return [ours[v] for v in sorted(sent)]
    if not stored:
        _settled("not stored: written again", first)
        try:
            return list(recorder.insert_events(lost.events, **lost.options))
        except CommitOutcomeUnknown as again:
            return settle(recorder, again)
    _settled("overtaken by another writer", first)
    raise IntegrityError(
        f"session {first.originator_id}: versions {min(sent)}..{max(sent)} were written by"
        " another writer while this save's outcome was unknown"
    )


def _stored(
    recorder: Any, originator_id: Any, low: int, high: int
) -> dict[int, tuple[int, str, bytes]]:
    """The stored events of the stream at versions low..high: version → (position, topic, state)."""
    statement = sql.SQL(
        "SELECT originator_version, notification_id, topic, state FROM {}.{}"
        " WHERE originator_id = %s AND originator_version BETWEEN %s AND %s"
    ).format(sql.Identifier(recorder.datastore.schema), sql.Identifier(recorder.events_table_name))
    with recorder.datastore.get_connection() as conn, conn.cursor() as curs:
        rows = curs.execute(statement, (originator_id, low, high)).fetchall()
    return {
        int(r["originator_version"]): (int(r["notification_id"]), r["topic"], bytes(r["state"]))
        for r in rows
    }


def _settled(outcome: str, first: StoredEvent) -> None:
    with _counts_lock:
        counts[outcome] += 1
    log.warning(
        "the unanswered commit of session %s settled: %s",
        first.originator_id,
        outcome,
        extra={"lost_commit": outcome},
    )
