"""Purging a session: its events, snapshots, read-model rows and sandbox go; a record stays.

This is the one place where stored events are deleted, and only when an
operator (or the retention job) asks. The steps, each one safe to run again,
so that a purge killed anywhere finishes on the next try:

1. **intent**: the purge record (``application.store.purges``), state
   ``purging``, with who asked and why;
2. **close**: the session is closed (if it was not), so no writer can add to
   it (every command re-reads the session and is refused); the session's
   lease is held meanwhile, so no worker drives it;
3. **read models**: every read model is brought past the session's last
   event, so no runner still holds one of its events to fold after the rows
   are gone;
4. **sandbox**: the session's recorded tool processes still alive here are
   killed, and its sandbox directory removed;
5. **drop**: in one transaction, the record notes what existed (the number of
   events, the last position), and the events, the snapshots and every
   session-keyed row go (the head, the last version and its chained hash,
   was noted before the close of step 2, so it is the one anyone kept);
6. **done**: what a late writer added is deleted again, the record's state
   becomes ``done``, and the other processes are told (they drop their
   cached copies).

Refused while a turn is open (409), for an unknown session (404), and for a
session purged already (410 ``session_purged``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg

from turnlog.application.errors import PurgeRefused, SessionNotFound, SessionPurged
from turnlog.application.sessions import Sessions
from turnlog.application.store import logorder, purges
from turnlog.application.store.database import Database, bootstrap_lock, connect
from turnlog.application.store.logorder import Place
from turnlog.application.store.purges import PurgeRecord, purged_error
from turnlog.application.store.recorder import Hint, log_channel, payload_of
from turnlog.application.store.topics import PURGE_MARK
from turnlog.application.tools.processes import kill_group
from turnlog.application.tools.sandboxes import live_processes
from turnlog.domain import errors as domain_errors
from turnlog.domain.session import Session

log = logging.getLogger("turnlog.purge")

MAX_TEXT = 2000
# The steps after which a purge may be told to pause (a test kills it there).
STEPS = ("intent", "closed", "read_models", "sandbox", "dropped")

# Brings every read model past a place in the log; False when one could not get there.
SettleReads = Callable[[Place], bool]


@dataclass
class Purger:
    """Purges sessions of one namespace (see the module doc)."""

    sessions: Sessions
    db: Database
    sandbox_root: Path
    try_lease: Callable[[UUID], Any]  # the session's lease, or None while someone holds it
    settle_reads: SettleReads | None = None
    pause: Callable[[str], None] = lambda step: None

    @property
    def schema(self) -> str:
        return str(self.sessions.recorder.datastore.schema)  # type: ignore[attr-defined]

    def record(self, session_id: UUID) -> PurgeRecord | None:
        with connect(self.db) as conn:
            return purges.find(conn, self.schema, session_id)

    def purge(self, session_id: UUID, reason: str, actor: str) -> PurgeRecord:
        """Purge the session, or finish a purge of it that stopped halfway."""
        reason, actor = _text(reason, "reason"), _text(actor, "actor")
        found = self.record(session_id)
        if found is not None and found.done:
            raise purged_error(found)
        if found is None:
            session = self.sessions.get_session(session_id)  # SessionNotFound: 404
            _refuse_open_turn(session)
        lease = self.try_lease(session_id)
        if lease is None:
            raise PurgeRefused(
                f"session {session_id} is being driven by a worker (or purged by another"
                " process): try again once its turn has ended",
            )
        try:
            return self._run(session_id, reason, actor, found)
        finally:
            lease.release()

    def _run(
        self, session_id: UUID, reason: str, actor: str, found: PurgeRecord | None
    ) -> PurgeRecord:
        with connect(self.db) as conn:
            if found is None:
                self._create_table()
                found = purges.begin(conn, self.schema, session_id, actor, reason)
                log.info("purge of session %s begun by %s", session_id, actor)
                self.pause("intent")
            if not found.dropped:
                self._close(conn, session_id, actor)
                self.pause("closed")
                self._settle(session_id)
                self.pause("read_models")
                self._clear_sandbox(session_id)
                self.pause("sandbox")
                dropped = purges.drop_rows(
                    conn, self.schema, self._events_table, self._snapshots_table, session_id
                )
                log.info(
                    "purge of session %s dropped %d events, %d snapshots, %s",
                    session_id,
                    dropped.events,
                    dropped.snapshots,
                    ", ".join(f"{n} {t} rows" for t, n in dropped.rows.items()) or "no rows",
                )
                self.pause("dropped")
            # What a late writer added since (a save that read the session before its
            # close and stored after the drop) goes too; the record keeps what it noted.
            purges.drop_rows(
                conn, self.schema, self._events_table, self._snapshots_table, session_id
            )
            self._remove_sandbox(session_id)
            record = purges.finish(conn, self.schema, session_id)
            self._tell_others(conn, record)
        forget(self.sessions, session_id)
        log.info("purge of session %s done", session_id)
        return record

    def resume_unfinished(self) -> list[PurgeRecord]:
        """Finish every purge a process left halfway (the retention job runs it)."""
        with connect(self.db) as conn:
            waiting = purges.unfinished(conn, self.schema)
        done = []
        for session_id in waiting:
            found = self.record(session_id)
            if found is None or found.done:
                continue
            try:
                done.append(self.purge(session_id, found.reason, found.actor))
            except (PurgeRefused, domain_errors.Conflict) as exc:
                log.warning("purge of session %s still waits: %s", session_id, exc)
        return done

    # ---------------------------------------------------------------- steps

    @property
    def _events_table(self) -> str:
        return str(self.sessions.recorder.events_table_name)  # type: ignore[attr-defined]

    @property
    def _snapshots_table(self) -> str | None:
        snapshots = self.sessions.snapshots
        if snapshots is None:
            return None
        return str(snapshots.recorder.events_table_name)  # type: ignore[attr-defined]

    def _create_table(self) -> None:
        with bootstrap_lock(self.db) as conn:
            conn.execute(purges.create_statement(self.schema))

    def _close(self, conn: psycopg.Connection[Any], session_id: UUID, actor: str) -> None:
        """Note the head, then close the session if it is open: every later command is refused."""
        try:
            session = self.sessions.get_session(session_id)
        except (SessionNotFound, SessionPurged):
            return  # its events are gone already (a late repeat)
        purges.note_head(
            conn, self.schema, self._events_table, session_id, again=not session.closed
        )
        if session.closed:
            return
        _refuse_open_turn(session)
        self.sessions.update(
            session_id, lambda s: s.close("purge", actor) if not s.closed else None
        )

    def _settle(self, session_id: UUID) -> None:
        if self.settle_reads is None:
            return
        place = self._last_place(session_id)
        if place is not None and not self.settle_reads(place):
            raise PurgeRefused(
                f"the read models have not yet processed session {session_id}'s last event;"
                " the purge is recorded and finishes when asked again",
            )

    def _last_place(self, session_id: UUID) -> Place | None:
        statement = psycopg.sql.SQL(
            "SELECT {xact}::text AS x, notification_id FROM {t} WHERE originator_id = %s"
            " ORDER BY {xact} DESC, notification_id DESC LIMIT 1"
        ).format(xact=logorder.XACT, t=logorder.table(self.schema, self._events_table))
        with connect(self.db) as conn:
            row = conn.execute(statement, (session_id,)).fetchone()
        return None if row is None else Place(int(row[0]), int(row[1]))

    def _clear_sandbox(self, session_id: UUID) -> None:
        """Kill the session's recorded processes still alive here, then remove its sandbox."""
        try:
            record = self.sessions.get_record(session_id)
        except (SessionNotFound, SessionPurged):
            record = None
        if record is not None:
            for live in live_processes(record):
                if kill_group(live.process):
                    log.info(
                        "purge killed process group %d of session %s", live.process.pid, session_id
                    )
        self._remove_sandbox(session_id)

    def _tell_others(self, conn: psycopg.Connection[Any], record: PurgeRecord) -> None:
        """Notify the log's listeners: every process drops what it keeps of the session.

        A hint past every version the session had, so no reader takes it as old news.
        """
        recorder: Any = self.sessions.recorder
        hint = Hint(record.session_id, PURGE_MARK, (record.head_version or 0) + 1)
        payload = payload_of(recorder.notifier.origin, [hint])
        conn.execute("SELECT pg_notify(%s, %s)", (log_channel(recorder), payload))

    def _remove_sandbox(self, session_id: UUID) -> None:
        path = self.sandbox_root / str(session_id)
        if path.is_symlink():
            path.unlink()
        elif path.exists():
            fd = os.open(self.sandbox_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                shutil.rmtree(str(session_id), dir_fd=fd)
            finally:
                os.close(fd)


def forget_purged(sessions: Sessions) -> Callable[[Sequence[Any]], None]:
    """A news listener (mark ``PURGE_MARK``): another process purged these sessions."""

    def listener(news: Sequence[Any]) -> None:
        for piece in news:
            forget(sessions, piece.session_id)

    return listener


def forget(sessions: Sessions, session_id: UUID) -> None:
    """Drop what this process keeps of a session in memory (it was purged)."""
    sessions.cache.forget(session_id)
    sessions.copies.forget(session_id)
    cache: Any = getattr(sessions.repository, "cache", None)
    if cache is not None:
        with contextlib.suppress(KeyError):
            cache.get(session_id, evict=True)


def _refuse_open_turn(session: Session) -> None:
    turn = session.open_turn
    if turn is not None:
        raise domain_errors.TurnInProgress(
            f"turn {turn.turn_id} of session {session.id} is {turn.state}: a session is"
            " purged only with no turn open (let it end, cancel or abandon it first)",
            turn_id=turn.turn_id,
        )


def _text(value: str, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise domain_errors.InvalidOperatorAction(f"a purge needs a {what}")
    if len(value) > MAX_TEXT:
        raise domain_errors.InvalidOperatorAction(f"the {what} is over {MAX_TEXT} characters")
    return value.strip()
