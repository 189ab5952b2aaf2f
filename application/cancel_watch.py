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
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime
from types import TracebackType
from uuid import UUID

from turnlog.application.processes import kill_group
from turnlog.application.sessions import Sessions
from turnlog.domain.turns import Effect, ToolProcess

log = logging.getLogger("turnlog.execution")

POLL_SECONDS = 0.5


def utc_now() -> datetime:
    return datetime.now(UTC)


class CancelWatch:
    """Watches one running attempt of a tool call; ``killed`` says it was stopped."""

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
        self._done = threading.Event()
        self._version = -1
        self._due_seen = False
        self._thread = threading.Thread(target=self._run, name="turnlog-cancel-watch", daemon=True)

    def __enter__(self) -> CancelWatch:
        self._version = self.sessions.version_of(self.session_id)
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._done.wait(self.interval):
            try:
                if self._check():
                    return
            except Exception:  # a failed look is retried at the next tick
                if self.sessions.closed:  # the process stops: its turns are left to recovery
                    log.debug("cancel watch of %s ends: the process is stopping", self.call_id)
                    return
                log.warning("checking for a cancel request failed", exc_info=True)

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
