"""Running this process's read models: the tables, then the runner thread.

``ProjectionSupervisor`` prepares the read models' tables and starts one
``ReadModelRunner`` (``projections.runner``) for all of them; stopping it
ends the thread, and each read model's lock goes with its connection.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import asdict
from types import TracebackType
from typing import Any

from turnlog.application.sessions import Sessions
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database
from turnlog.application.store.follower import LogFollower
from turnlog.projections.catalog import read_models
from turnlog.projections.log import EventLog, create_tables
from turnlog.projections.runner import ReadModelRunner


class ProjectionSupervisor:
    """Runs this process's read-model runner (all its read models): ``start()``, then ``stop()``.

    Connections: one pool for reading the log and writing the views (its
    sizes from ``settings.pool_size`` / ``pool_max_overflow``; shared with
    the process's ``sessions`` application), plus one dedicated connection per read
    model for its lock. New events come from the process's ``follower``;
    without one (or with ``listen=False``) the runner polls the log.
    """

    def __init__(
        self,
        settings: Settings,
        db: Database,
        names: str | Iterable[str] | None = None,
        *,
        sessions: Sessions,
        batch_size: int = 500,
        poll_interval: float = 0.5,
        listen: bool = True,
        follower: LogFollower | None = None,
    ) -> None:
        self.settings = settings
        self.db = db
        self.models = read_models(names)
        self._sessions = sessions
        self._batch_size = batch_size
        self._poll_interval = poll_interval
        self._follower = follower if listen else None
        self._stopping = threading.Event()
        self._runner: ReadModelRunner | None = None
        self._events: EventLog | None = None

    def start(self) -> None:
        """Prepare the tables and start the runner thread (one for every read model)."""
        if self._runner is not None:
            raise RuntimeError("the projection supervisor is already running")
        self._events = EventLog(self._sessions)
        try:
            create_tables(self.db, self._events, self.models)
        except BaseException:
            self.stop()
            raise
        self._stopping.clear()
        self._runner = ReadModelRunner(
            self.models,
            self._events,
            self.db,
            self.settings.namespace,
            self._stopping,
            batch_size=self._batch_size,
            poll_interval=self._poll_interval,
            follower=self._follower,
        )
        self._runner.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the runner (each read model's lock goes with its connection)."""
        self._stopping.set()
        if self._runner is not None:
            self._runner.join(timeout)
            self._runner.close()
        self._runner = None
        self._events = None

    def own_reads(self) -> int:
        """How often this process's runner read the log itself (not the follower's pages)."""
        return self._runner.own_reads if self._runner is not None else 0

    def commits(self) -> int:
        """The transactions this process's runner committed to fold events."""
        return self._runner.commits if self._runner is not None else 0

    def runners(self) -> list[dict[str, Any]]:
        """This process's read models: name, state, position, restarts, last error."""
        return [asdict(state) for state in self._runner.states] if self._runner else []

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
