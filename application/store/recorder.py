"""The events recorder: the library's PostgreSQL recorder, one round trip per save, no table lock.

The library's default insert path takes ``LOCK TABLE … IN EXCLUSIVE MODE``
and sends ``NOTIFY`` inside every insert transaction, so every writer of a
namespace waits for the previous one's commit and disk flush, and
PostgreSQL can never group the commits of concurrent writers. This recorder
takes neither:

- one ``INSERT … SELECT FROM unnest(…)`` in one autocommit statement (one
  round trip per save) also records the inserting transaction's id
  (``xact_id``, ``pg_current_xact_id()``). Readers of the whole log order it
  by (transaction id, position) and read only below the commit horizon, so
  no reader can pass an event that commits later (``application.store.logorder``,
  docs/log-order.md);
- the notification goes out *after* the commit, as a transaction of its own
  (``NOTIFY`` in the insert's transaction would hold every writer's commit
  behind a database-wide lock). A save someone waits on (a submitted turn, a
  turn's end) sends it in the save's own round trip: ``BEGIN``, the insert,
  ``COMMIT`` and ``pg_notify`` go out together in one pipeline, so a
  listener hears of the commit as soon as the writer does, with every news
  held back until then (``Notifier.take_now``). Otherwise, and while the
  notifier's thread is sending one, the thread sends it, coalescing a burst
  of saves into one ``NOTIFY``; a save of a turn's middle steps only
  (``store.topics.deferrable``: also a submission claimed in its own save,
  whose notification carries no hint) waits up to ``DEFER`` there for the
  next one.
  Notifications go on the namespace's own channel. Their payload names the sessions
  whose saves since the last one hold news somebody waits for (a turn to
  take, a turn's end: ``Hint``), so a listener can act on them before it
  reads the log. A notification lost (the process died between the commit
  and the ``NOTIFY``) costs latency only: every reader also polls;
- the same statement stores each event's hash, chained to the previous
  event of its stream (``application.store.chain``): the previous hash is read
  in the statement itself, so the chain costs no extra round trip;
- the optimistic-concurrency primary key is the library's, unchanged.

Creating the table also migrates an events table written by older code
(the column, its default and the index of the log's order; the nullable
``hash`` column; stored events are not rewritten). It first asks the catalog
and runs nothing when every object is there: PostgreSQL takes a table's
SHARE lock for ``CREATE INDEX IF NOT EXISTS`` before it looks, so that
statement waits for every open write transaction and queues every later
writer behind it. When something is missing the statements run under
``SCHEMA_LOCK_TIMEOUT``: a start fails rather than queue the namespace. A
table that exists but needs migrating is migrated only by a process that
owns the schema (``TURNLOG_OWNS_SCHEMA`` in the library's environment:
``serve``, ``worker``, ``projections run``, ``db init``); a one-shot command
refuses with ``SchemaNotReady`` instead. A namespace with no table yet is
created by any process: there is no writer to block.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple
from uuid import UUID

from eventsourcing.persistence import OperationalError as PersistenceOperationalError
from eventsourcing.persistence import StoredEvent
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
from eventsourcing.utils import retry
from psycopg import Connection, Cursor, InterfaceError, OperationalError
from psycopg.errors import DuplicateObject
from psycopg.sql import SQL

from turnlog.application.errors import ApplicationError, SchemaNotReady
from turnlog.application.store import chain, logorder, topics
from turnlog.application.store import epoch as store_epoch
from turnlog.application.store.arrays import Blobs, Integers, Texts, Uuids
from turnlog.application.store.database import rendered
from turnlog.application.store.lost_commits import (
    EPOCH,
    RIDES,
    CommitOutcomeUnknown,
    unanswered,
)


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


log = logging.getLogger("turnlog.recorder")

# Longest delay of a notification for a save of deferrable events only (see Notifier).
DEFER = 0.02
# A notification's payload: this format's tag, the sender, one word per hint (see payload_of).
PAYLOAD_FORMAT = "1"
ORIGIN_LENGTH = 16  # hex digits of a notifier's origin, drawn at random per process
MAX_PAYLOAD = 7900  # PostgreSQL refuses a payload of 8,000 bytes or more
_BEGIN = rendered(SQL("BEGIN"))
_COMMIT = rendered(SQL("COMMIT"))


class Hint(NamedTuple):
    """News of one session in a notification: committed before it was sent.

    ``marks``: one letter per kind of news (``Notifier.marks``); ``version``:
    the highest version of the session's events that carried one.
    """

    session_id: UUID
    marks: str
    version: int


class Taken(NamedTuple):
    """A notification taken by a save to send itself, after its commit (``Notifier.take_now``)."""

    payload: str
    pending: dict[UUID, Hint]  # news of earlier saves it carries: given back if the save fails


class Notice(NamedTuple):
    """What a notification's payload tells: who sent it, and the news in it."""

    origin: str  # the sending notifier's (``Notifier.origin``): one per process
    hints: list[Hint]


def payload_of(origin: str, hints: Sequence[Hint]) -> str:
    """The payload that carries ``hints``: "1 <origin> <session hex>:<marks>:<version> …".

    Too many for one payload: none at all (""), and listeners read the log to know.
    """
    words = [PAYLOAD_FORMAT, origin]
    words += (f"{h.session_id.hex}:{h.marks}:{h.version}" for h in hints)
    payload = " ".join(words)
    return payload if len(payload) <= MAX_PAYLOAD else ""


def notice_of(payload: str) -> Notice | None:
    """What a notification's payload tells; None when it tells nothing.

    None for an empty payload (a notification from a writer that sent no news,
    or more than one payload holds) or one in another format: the listener
    must read the log to know what changed.
    """
    words = payload.split(" ")
    if len(words) < 2 or words[0] != PAYLOAD_FORMAT or not _is_origin(words[1]):
        return None
    hints = []
    for word in words[2:]:
        try:
            session, marks, version = word.split(":")
            hints.append(Hint(UUID(hex=session), marks, int(version)))
        except ValueError:
            return None
    return Notice(words[1], hints)


def _is_origin(word: str) -> bool:
    return len(word) == ORIGIN_LENGTH and all(c in "0123456789abcdef" for c in word)


def log_channel(recorder: object) -> str:
    """The NOTIFY channel of the log ``recorder`` writes: its writers notify it after commits.

    Channels are per database, not per schema: the name holds both the
    namespace's schema and the events table (shortened to PostgreSQL's 63 bytes).
    """
    if not isinstance(recorder, PostgresApplicationRecorder):
        raise TypeError("notifications need the Sessions application on PostgreSQL")
    name = f"{recorder.datastore.schema}.{recorder.events_table_name}"
    if len(name) <= 63:
        return name
    digest = hashlib.blake2b(name.encode(), digest_size=6).hexdigest()
    return f"{name[:50]}~{digest}"


class Notifier:
    """Sends ``NOTIFY channel`` after commits; a burst coalesces into one.

    A save is notified at once, unless ``deferrable`` says it is a middle step
    of a running turn: then within ``DEFER`` seconds, or with the next save
    notified at once, whichever comes first. At once means in the save's own
    round trip (``take_now``), or from this notifier's thread while that is
    sending one (the thread also sends the deferred ones). One notification
    covers every commit before it, so the steps of a turn in between its
    submission and its end cost no notification of their own while turns
    keep ending. Its payload holds a ``Hint`` for each session whose saves
    since the last notification hold an event of a topic in ``marks`` (topic
    -> letter), but for a submission claimed in its own save (``unhinted``:
    no work in it for anyone else).
    """

    def __init__(self, datastore: PostgresDatastore, channel: str) -> None:
        self._datastore = datastore
        self._channel = channel
        self.statement = rendered(SQL("SELECT pg_notify(%s, %s)"))  # (channel, payload)
        # The log's topic vocabulary (store.topics): which saves may wait, which hint what.
        self.deferrable: Callable[[Sequence[str]], bool] = topics.deferrable
        self.unhinted: Callable[[Sequence[str]], bool] = topics.claimed_submission
        self.marks: dict[str, str] = dict(topics.HINT_MARKS)
        self._hints: dict[UUID, Hint] = {}  # for the next notification
        # Names this process in its payloads: its own follower tells them from
        # another process's by it (its saves told this process's readers already).
        self.origin = secrets.token_hex(ORIGIN_LENGTH // 2)
        self.defer = DEFER  # seconds a save of deferrable events only may wait
        self._cond = threading.Condition()
        self._due: float | None = None  # when the next notification is due (monotonic)
        self._thread: threading.Thread | None = None
        self._closed = False
        self._sending = False  # the thread is sending one: a save leaves its news to it
        self.sent = 0

    def notify(
        self,
        topics: Sequence[str] = (),
        ids: Sequence[UUID | str] = (),
        versions: Sequence[int] = (),
    ) -> None:
        """Ask for a notification after the caller's commit of events of ``topics``.

        Soon, or within ``defer`` seconds when every topic is deferrable (none:
        soon). ``ids`` and ``versions``, beside ``topics``, are the events'
        sessions and versions: the notification's hints.
        """
        now = time.monotonic()
        due = now + self.defer if self.deferrable(topics) else now
        marked = [] if self.unhinted(topics) else self._marked(topics, ids, versions)
        with self._cond:
            if self._closed:
                return
            _merge(self._hints, marked)
            if self._due is None or due < self._due:
                self._due = due
                self._cond.notify()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="turnlog-notify", daemon=True
                )
                self._thread.start()

    def take_now(
        self, topics: Sequence[str], ids: Sequence[UUID | str], versions: Sequence[int]
    ) -> Taken | None:
        """The notification a save of ``topics`` sends itself, right after its commit.

        Taken when the save is to be notified at once and this notifier's
        thread is not sending one: it holds the save's hints and every hint
        pending, and nothing stays due. None: the saver calls ``notify``
        after its commit. A save that fails gives it back (``give_back``).
        """
        if self.deferrable(topics):
            return None
        marked = self._marked(topics, ids, versions)
        with self._cond:
            if self._closed or self._sending:
                return None
            pending, self._hints = self._hints, {}
            self._due = None
        hints = dict(pending)
        _merge(hints, marked)
        return Taken(payload_of(self.origin, list(hints.values())), pending)

    def give_back(self, taken: Taken) -> None:
        """A save that took a notification failed: its pending news goes out at once."""
        with self._cond:
            _merge(self._hints, list(taken.pending.values()))
        self.notify()

    def _marked(
        self, topics: Sequence[str], ids: Sequence[UUID | str], versions: Sequence[int]
    ) -> list[tuple[UUID | str, str, int]]:
        return [
            (sid, mark, version)
            for sid, version, topic in zip(ids, versions, topics, strict=False)
            if (mark := self.marks.get(topic))
        ]

    @property
    def due_in(self) -> float | None:
        """Seconds until the notification asked for is due (None: none is pending)."""
        due = self._due
        return None if due is None else due - time.monotonic()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (self._due is None or self._due > time.monotonic()):
                    self._cond.wait(None if self._due is None else self._due - time.monotonic())
                if self._closed:
                    return
                self._due = None
                hints, self._hints = self._hints, {}
                self._sending = True
            try:
                self._send(hints)
            finally:
                self._sending = False

    def _send(self, hints: dict[UUID, Hint]) -> None:
        payload = payload_of(self.origin, list(hints.values()))
        try:
            with self._datastore.get_connection() as conn:
                conn.execute(self.statement, (self._channel, payload))
            self.sent += 1
        except Exception as exc:  # a lost notification costs latency only: readers poll
            log.debug("notification not sent (%s); readers will poll", exc)

    def close(self, timeout: float = 2.0) -> None:
        """Send what is pending, then stop the thread."""
        with self._cond:
            self._closed = True
            pending, self._due = self._due is not None, None
            hints, self._hints = self._hints, {}
            thread = self._thread
            self._cond.notify_all()
        if pending:
            self._send(hints)
        if thread is not None:
            thread.join(timeout)


def _merge(hints: dict[UUID, Hint], marked: Sequence[tuple[UUID | str, str, int]]) -> None:
    """Add news (session, marks, version: a ``Hint`` too) to ``hints``: one hint per session."""
    for sid, mark, version in marked:
        session_id = sid if isinstance(sid, UUID) else UUID(sid)
        known = hints.get(session_id)
        if known is None:
            hints[session_id] = Hint(session_id, mark, version)
        else:
            marks = known.marks + "".join(m for m in mark if m not in known.marks)
            hints[session_id] = Hint(session_id, marks, max(version, known.version))


SCHEMA_LOCK_TIMEOUT = "5s"

# Set on the datastore by the factory: False in one-shot commands, which never migrate.
OWNS_SCHEMA = "turnlog_owns_schema"

_READY = SQL(
    "SELECT to_regclass(%(table)s) IS NOT NULL AS exists, to_regclass(%(table)s) IS NOT NULL"
    " AND to_regclass(%(index)s) IS NOT NULL AND to_regclass(%(order)s) IS NOT NULL"
    " AND (SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass(%(table)s)"
    "      AND attname IN ('xact_id', 'hash') AND NOT attisdropped) = 2 AS ready"
)


_LOCK_TIMEOUT = SQL("SELECT set_config('lock_timeout', %s, true)")


class TurnlogRecorder(PostgresApplicationRecorder):
    """Inserts a save's events in one statement, with their transaction id; notifies after."""

    def __init__(
        self, datastore: PostgresDatastore, *, events_table_name: str = "stored_events"
    ) -> None:
        super().__init__(datastore, events_table_name=events_table_name)
        schema = self.datastore.schema
        self.channel_name = log_channel(self)  # the library's own NOTIFY and LISTEN agree
        self.sql_create_statements.extend(
            logorder.migration_statements(schema, self.events_table_name)
        )
        self.sql_create_statements.append(chain.migration_statement(schema, self.events_table_name))
        self._insert = rendered(chain.insert_statement(schema, self.events_table_name))
        self._insert_riding = rendered(
            chain.insert_statement(schema, self.events_table_name, riding=True)
        )
        # By (number of events, riding): one stream's save, the common case.
        self._stream_inserts = {
            (count, riding): rendered(
                chain.stream_insert_statement(schema, self.events_table_name, count, riding)
            )
            for count in range(1, chain.STREAM_INSERT_MAX + 1)
            for riding in (False, True)
        }
        self.notifier = Notifier(self.datastore, self.channel_name)
        self.epoch = store_epoch.of(self.datastore)
        # The factory flushes it when the application closes (application/store/pool.py).
        notifiers: list[Notifier] = getattr(self.datastore, "turnlog_notifiers", [])
        notifiers.append(self.notifier)
        self.datastore.turnlog_notifiers = notifiers  # type: ignore[attr-defined]

    def create_table(self) -> None:
        """Create or migrate what is missing only (see the module docstring)."""
        schema = self.datastore.schema
        names = {
            "table": f"{_quoted(schema)}.{_quoted(self.events_table_name)}",
            "index": f"{_quoted(schema)}.{_quoted(self.notification_id_index_name)}",
            "order": f"{_quoted(schema)}.{_quoted(logorder.index_name(self.events_table_name))}",
        }
        with self.datastore.transaction(commit=False) as curs:
            curs.execute(_READY, names)
            row = curs.fetchone()
        if row is not None and row["ready"]:
            self.datastore.register_type_adapters()
            return
        if row is not None and row["exists"] and not getattr(self.datastore, OWNS_SCHEMA, True):
            raise SchemaNotReady(
                f"{names['table']} was written by an older version and must be migrated:"
                " run `turnlog db init` (or start serve); nothing was changed"
            )
        for statement in self.sql_create_statements:
            if "CREATE TYPE" in statement.as_string():  # no IF NOT EXISTS for types
                with (
                    self.datastore.transaction(commit=True) as curs,
                    contextlib.suppress(DuplicateObject),
                ):
                    curs.execute(statement, prepare=False)
        try:
            with self.datastore.transaction(commit=True) as curs:
                curs.execute(_LOCK_TIMEOUT, [SCHEMA_LOCK_TIMEOUT])
                self._create_table(curs)
        except (OperationalError, PersistenceOperationalError) as exc:
            cause = exc if isinstance(exc, OperationalError) else exc.__cause__
            if getattr(cause, "sqlstate", None) != "55P03":  # lock_not_available
                raise
            raise SchemaNotReady(
                f"{names['table']} must be migrated but a transaction holds it"
                f" (waited {SCHEMA_LOCK_TIMEOUT}); nothing was changed: start again"
                " when it has ended"
            ) from None
        self.datastore.register_type_adapters()

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> Sequence[int]:
        if kwargs.get("tracking") is not None:
            raise ApplicationError("this recorder does not record tracking positions")
        if not stored_events:
            return []
        params = (  # typed lists: written as array literals at once (store.arrays)
            Uuids([e.originator_id for e in stored_events]),
            Integers([e.originator_version for e in stored_events]),
            Texts([e.topic for e in stored_events]),
            Blobs([e.state for e in stored_events]),
            kwargs.get(EPOCH),
            kwargs.get(EPOCH),
        )
        # The insert is its own transaction (one autocommit statement, or BEGIN …
        # COMMIT ahead of its NOTIFY in one pipeline). Notified after it ended, also
        # when it failed (and then at once): a failed insert held the horizon back
        # while it ran, and readers waiting behind it should look again.
        riding = bool(kwargs.get(RIDES))
        insert = self._insert_riding if riding else self._insert
        values: tuple[Any, ...] | dict[str, Any] = params
        if chain.one_stream(params[0], params[1]):
            insert = self._stream_inserts[len(stored_events), riding]
            values = chain.stream_params(
                params[0][0], params[1][0], params[2], params[3], params[4]
            )
        taken = self.notifier.take_now(params[2], params[0], params[1])
        stored = sent = False
        try:
            with self.datastore.get_connection() as conn, conn.cursor() as curs:
                sent = True
                if taken is None:
                    curs.execute(insert, values, prepare=True)
                else:
                    self._insert_notifying(conn, curs, insert, values, taken.payload)
                rows = curs.fetchall()
            stored = bool(rows)
        except PersistenceOperationalError as exc:
            # Sent, and no answer: stored or not, nobody knows yet (store.lost_commits).
            if sent and unanswered(exc):
                detail = (str(exc).strip().splitlines() or ["connection lost"])[0]
                raise CommitOutcomeUnknown(detail, stored_events, kwargs) from exc
            raise
        finally:
            if stored:
                if taken is None:
                    self.notifier.notify(params[2], params[0], params[1])
                else:
                    self.notifier.sent += 1
            elif taken is not None:
                self.notifier.give_back(taken)
            else:
                self.notifier.notify()
        if not rows:
            raise store_epoch.refusal(self, stored_events[0], kwargs.get(EPOCH))
        self.epoch.saved_in(rows[0]["epoch"])
        return [int(row["notification_id"]) for row in rows]

    def _insert_notifying(
        self,
        conn: Connection[Any],
        curs: Cursor[Any],
        insert: bytes,
        params: tuple[Any, ...] | dict[str, Any],
        payload: str,
    ) -> None:
        """The insert in a transaction of its own, then its NOTIFY in another: one round trip.

        Refused (a version taken: a concurrent writer won) or lost, the
        pipeline skips the COMMIT and the NOTIFY, and the pool's connection
        context rolls the failed transaction back.
        """
        with conn.pipeline():
            conn.execute(_BEGIN, prepare=True)
            curs.execute(insert, params, prepare=True)
            conn.execute(_COMMIT, prepare=True)
            conn.execute(self.notifier.statement, (self.channel_name, payload), prepare=True)
