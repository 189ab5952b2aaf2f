"""Noticing, while a tool call runs, that its turn must stop.

The owner of a turn acts on a cancel request (``CancelRequested``) or a
passed deadline at the next step boundary. A tool call can run for minutes,
so while one runs a watcher thread looks at the session about twice a second:
one index lookup of its latest version, and a load only when it moved (or
when the deadline has passed). When the turn must stop and the call may be
stopped — a ``read_only``/``idempotent`` call, or any call when the cancel is
forced — the watcher sets the call's ``stop`` event (tools that wait, wait on
it) and kills the process groups recorded for the attempt. The executor then
records the call as stopped instead of whatever the tool returns. A
``side_effecting`` call is otherwise left to finish (bounded by its timeout).

One thread per process (``Watcher``) looks at every running call in turn,
so a call costs no thread of its own: starting and joining one per call
cost two scheduling hops per tool call, which a loaded machine made
milliseconds. The version the watch starts from is the one the call's
start was saved at, so a cancel recorded in between is seen at the first
look.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime
from types import TracebackType
from uuid import UUID

from turnlog.application.sessions import Sessions
from turnlog.application.tools.processes import kill_group
from turnlog.domain.turns import Effect, ToolProcess

log = logging.getLogger("turnlog.execution")

POLL_SECONDS = 0.5


def utc_now() -> datetime:
    return datetime.now(UTC)


class Watcher:
    """The one thread that looks at the running calls' sessions, each at its own interval."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._watches: set[CancelWatch] = set()
        self._thread: threading.Thread | None = None
        # When the thread wakes by itself next (None: only when told); a watch
        # added that is due no sooner does not wake it (a wake per tool call
        # cost a thread switch on the running worker's core).
        self._wakes_at: float | None = None

    def add(self, watch: CancelWatch) -> None:
        with self._cond:
            self._watches.add(watch)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="turnlog-cancel-watch", daemon=True
                )
                self._thread.start()
            if self._wakes_at is None or watch.next_look < self._wakes_at:
                self._cond.notify()

    def remove(self, watch: CancelWatch) -> None:
        with self._cond:
            self._watches.discard(watch)

    @property
    def watching(self) -> int:
        return len(self._watches)

    def _run(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                due = [w for w in self._watches if w.next_look <= now]
                if not due:
                    self._wakes_at = min((w.next_look for w in self._watches), default=None)
                    self._cond.wait(None if self._wakes_at is None else self._wakes_at - now)
                    self._wakes_at = None
                    continue
            for watch in due:  # outside the lock: a look is a database read
                watch.look()


WATCHER = Watcher()


class CancelWatch:
    """Watches one running attempt of a tool call; ``killed`` says it was stopped.

    ``version``: the session's version when the call's start was saved (read
    from the database when not given).
    """

    def __init__(
        self,
        sessions: Sessions,
        session_id: UUID,
        turn_id: str,
        call_id: str,
        attempt: int,
        effect: Effect,
        stop: threading.Event,
        deadline_at: datetime | None,
        interval: float = POLL_SECONDS,
        version: int | None = None,
        watcher: Watcher = WATCHER,
    ) -> None:
        self.sessions = sessions
        self.session_id = session_id
        self.turn_id = turn_id
        self.call_id = call_id
        self.attempt = attempt
        self.effect = effect
        self.stop = stop
        self.deadline_at = deadline_at
        self.interval = interval
        self.killed = False
        self.next_look = time.monotonic() + interval
        self._watcher = watcher
        self._lock = threading.Lock()  # a look in progress finishes before the watch ends
        self._ended = False
        self._version = -1 if version is None else version
        self._due_seen = False

    def __enter__(self) -> CancelWatch:
        if self._version < 0:
            self._version = self.sessions.version_of(self.session_id)
        self._watcher.add(self)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with self._lock:
            self._ended = True
        self._watcher.remove(self)

    @property
    def ended(self) -> bool:
        """The watch looks no more: its call ended, was stopped, or its process stops."""
        return self._ended

    def look(self) -> None:
        """One look (on the watcher's thread); the watch ends when its call was stopped."""
        with self._lock:
            if self._ended:
                return
            self.next_look = time.monotonic() + self.interval
            try:
                finished = self._check()
            except Exception:  # a failed look is retried at the next tick
                if not self.sessions.closed:
                    log.warning("checking for a cancel request failed", exc_info=True)
                    return
                # The process stops: its turns are left to recovery.
                log.debug("cancel watch of %s ends: the process is stopping", self.call_id)
                finished = True
            if finished:
                self._ended = True
        if finished:
            self._watcher.remove(self)

    def _check(self) -> bool:
        """Look once; True when the call was stopped (nothing more to watch)."""
        now = utc_now()
        due = self.deadline_at is not None and now >= self.deadline_at and not self._due_seen
        version = self.sessions.version_of(self.session_id)
        if version == self._version and not due:
            return False
        self._version, self._due_seen = version, self._due_seen or due
        session = self.sessions.get_session(self.session_id)
        if not session.turn_state(self.turn_id).is_open:
            return True
        turn = session.turn(self.turn_id)
        reason = turn.cancel_due(now)
        if not reason or not (self.effect.safe_to_repeat or turn.cancel_force):
            return False
        log.info("stopping tool call %s: %s", self.call_id, reason)
        self.killed = True
        self.stop.set()
        # Read again after setting ``stop``: a process recorded before this read is
        # killed here; one recorded after it sees ``stop`` and never starts.
        session = self.sessions.get_session(self.session_id)
        for p in session.call(self.call_id).processes:
            if p.get("attempt") == self.attempt:
                process = ToolProcess(p["pid"], p["process_started_at"], p["host"], p["boot_id"])
                kill_group(process)
        return True
