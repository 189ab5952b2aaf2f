"""The server's epoch (when it last started): what this process read before a restart may be lost.

A commit that rode (``domain.durability``) is visible to every reader at
once, before it is on disk; a crash of the database loses it, and may give
its transaction id and log position out again. So whatever a process read
or wrote before the server restarted may hold events the log no longer has:
a session object kept between steps, the caches, a page of the log not yet
folded. The server's start time (``pg_postmaster_start_time()``) tells one
incarnation from the next:

- every save carries the epoch in which its session object was read (or
  last saved), and inserts nothing when the server's differs
  (``chain.insert_statement``): the writer reads the session again;
- when this process learns of a new epoch (a save refused so, a page of
  the log read in it), everything registered with ``on_restart`` is
  dropped: the session caches, the follower's place (``store.follower``);
- a read model folds a page only in the epoch it was read in
  (``projections.view.fold_together``).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from datetime import datetime
from typing import Any

from eventsourcing.application import Cache, LRUCache
from eventsourcing.persistence import IntegrityError, StoredEvent

from turnlog.application.store import lost_commits

log = logging.getLogger("turnlog.recorder")

STATEMENT = "SELECT pg_postmaster_start_time()"


class Epoch:
    """The epoch this process knows of its database, and what to drop when it changes."""

    def __init__(self, datastore: Any) -> None:
        self._datastore = datastore
        self._lock = threading.Lock()
        self._value: datetime | None = None
        self._on_restart: list[Callable[[], None]] = []
        self._stamps: dict[int, datetime | None] = {}  # id(object) → epoch it was read in
        self._local = threading.local()

    def current(self) -> datetime | None:
        """The epoch known, asked of the server the first time (None: it cannot be read)."""
        if self._value is None:
            try:
                with self._datastore.get_connection() as conn:
                    row = conn.execute(STATEMENT).fetchone()
            except Exception:  # unreachable now: the first save will say
                return None
            if row is not None:
                self.learned(_first(row))
        return self._value

    def saved_in(self, value: datetime) -> None:
        """A save of this thread's was stored in epoch ``value`` (the recorder tells)."""
        self._local.saved = value
        self.learned(value)

    def last_saved_in(self) -> datetime | None:
        """The epoch this thread's last save was stored in."""
        return getattr(self._local, "saved", None)

    def learned(self, value: datetime | None) -> bool:
        """The server's epoch, as just read; True when it is a new one (then drop what is kept)."""
        if value is None:
            return False
        with self._lock:
            before, self._value = self._value, value
            hooks = list(self._on_restart) if before is not None and before != value else []
        if hooks:
            log.warning(
                "the database restarted (at %s): what this process kept from before is dropped",
                value.isoformat(),
            )
        for hook in hooks:
            try:
                hook()
            except Exception:
                log.exception("dropping what was kept from before a restart failed")
        return bool(hooks)

    def on_restart(self, hook: Callable[[], None]) -> None:
        with self._lock:
            self._on_restart.append(hook)

    def stamp(self, obj: object, epoch: datetime | None) -> None:
        """Remember the epoch ``obj`` (a session object) was read or saved in."""
        key = id(obj)
        with self._lock:
            known = key in self._stamps
            self._stamps[key] = epoch
        if not known:
            weakref.finalize(obj, self._forget, key)

    def stamp_of(self, obj: object) -> datetime | None:
        with self._lock:
            return self._stamps.get(id(obj))

    def _forget(self, key: int) -> None:
        with self._lock:
            self._stamps.pop(key, None)


def of(datastore: Any) -> Epoch:
    """The one ``Epoch`` of a datastore (made the first time)."""
    epoch: Epoch | None = getattr(datastore, "turnlog_epoch", None)
    if epoch is None:
        epoch = Epoch(datastore)
        datastore.turnlog_epoch = epoch
    return epoch


def watch(app: Any) -> Epoch | None:
    """The epoch of ``app``'s database, dropping its caches on a restart (None: not PostgreSQL)."""
    datastore = getattr(app.recorder, "datastore", None)
    if datastore is None:
        return None  # in-memory persistence (unit tests): no server to restart
    epoch = of(datastore)
    epoch.on_restart(lambda: _drop_caches(app))
    return epoch


def _drop_caches(app: Any) -> None:
    app.cache.clear()
    app.copies.clear()
    cache = app.repository.cache
    if cache is not None:  # the library's: replaced, since its clear() keeps the entries
        app.repository.cache = LRUCache(cache.maxsize) if isinstance(cache, LRUCache) else Cache()


def save(app: Any, session: Any, rides: bool) -> int:
    """Save ``session`` in the epoch it was read in (``lost_commits.save``); stamp it anew."""
    epoch: Epoch | None = app.epoch
    if epoch is None:
        return lost_commits.save(app, session, rides)
    position = lost_commits.save(app, session, rides, epoch.stamp_of(session))
    epoch.stamp(session, epoch.last_saved_in())
    return position


def refusal(recorder: Any, first: StoredEvent, epoch: datetime | None) -> IntegrityError:
    """Why an insert stored nothing (``chain.insert_statement``): a restart, or a gap.

    Either is a conflict: the writer reads the session again and decides again
    (a fenced step of a turn finds its claim gone, and stops).
    """
    with recorder.datastore.get_connection() as conn:
        row = conn.execute(STATEMENT).fetchone()
    now = _first(row)
    if epoch is not None and now is not None and now != epoch:
        recorder.epoch.learned(now)
        return IntegrityError(
            f"session {first.originator_id}: the database restarted after this process"
            " read the session; it is read again"
        )
    # The stream's event before this save's first is missing: a commit that rode was
    # lost in a crash of the database, and this writer's copy of the session held it.
    log.warning(
        "session %s: version %d is missing, so version %d was not stored (a commit lost"
        " in a crash of the database); the session is read again",
        first.originator_id,
        first.originator_version - 1,
        first.originator_version,
    )
    return IntegrityError(
        f"session {first.originator_id}: version {first.originator_version - 1} is missing"
    )


class ServerRestarted(Exception):
    """Events were read before the database restarted: the restart may have lost some."""


_SAME = "SELECT pg_postmaster_start_time() = %s::timestamptz"


def same_epoch(conn: Any, epoch: datetime) -> Callable[[], None]:
    """Ask (in a pipeline, with what follows) whether the server still has ``epoch``.

    The returned check raises ``ServerRestarted`` when it has started again since.
    """
    cursor = conn.execute(_SAME, [epoch])

    def check() -> None:
        if not _first(cursor.fetchone()):
            raise ServerRestarted(
                f"the database restarted after these events were read (it had started at"
                f" {epoch}): they are read again"
            )

    return check


def _first(row: Any) -> Any:
    if row is None:
        return None
    return next(iter(row.values())) if isinstance(row, dict) else row[0]
