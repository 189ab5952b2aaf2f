"""Each serving process drops what it keeps of sessions purged by another process.

The purging process notifies the log's listeners (``application.purge``), and
the process's news feed hands the hint over at once. A notification can be
lost (the listener's connection was down at the time), so the watch also
looks at the namespace's purge records every ``interval`` seconds: a lost
notification costs latency only, as every other one does.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime

import psycopg

from turnlog.application.errors import ApplicationError
from turnlog.application.purge import forget
from turnlog.application.sessions import Sessions
from turnlog.application.store import purges
from turnlog.application.store.database import Database, connect

log = logging.getLogger("turnlog.purge")

INTERVAL = 5.0


class PurgeWatch:
    """A thread that forgets, in this process, every session another process purged."""

    def __init__(self, sessions: Sessions, db: Database, interval: float = INTERVAL) -> None:
        self.sessions = sessions
        self.db = db
        self.interval = interval
        self.schema = str(sessions.recorder.datastore.schema)  # type: ignore[attr-defined]
        self.forgotten = 0
        self._since: datetime | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="turnlog-purges", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def look(self) -> list[str]:
        """Forget the sessions purged since the last look; returns their ids."""
        with connect(self.db) as conn:
            found, self._since = purges.finished_since(conn, self.schema, self._since)
        for session_id in found:
            forget(self.sessions, session_id)
        self.forgotten += len(found)
        return [str(s) for s in found]

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.look()
            except (psycopg.Error, ApplicationError) as exc:
                log.warning("looking for purged sessions failed (%s); trying again", exc)
