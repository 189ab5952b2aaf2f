"""What one ``turnlog serve`` process runs, by role, and in which order it starts and stops.

``all`` runs the HTTP API, a worker and the projection runners in one
process (the simple default); ``api``, ``worker`` and ``projections`` split
them. Every role builds the runtime (which prepares the namespace) and
nothing that replays the log: the worker starts from the open-turns read
model, projections resume from their tracking positions, and the API reads
sessions one by one on demand.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from turnlog.application.follower import LogFollower
from turnlog.application.log_context import bound
from turnlog.application.observer import Observer
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.application.worker import OpenTurnRef, Worker
from turnlog.interface.bootstrap import build_runtime
from turnlog.projections import ProjectionSupervisor, ReadModels

log = logging.getLogger("turnlog.serve")


class Role(StrEnum):
    """Which parts a serve process runs."""

    ALL = "all"
    API = "api"
    WORKER = "worker"
    PROJECTIONS = "projections"

    @property
    def serves_api(self) -> bool:
        return self in (Role.ALL, Role.API)

    @property
    def runs_worker(self) -> bool:
        return self in (Role.ALL, Role.WORKER)

    @property
    def runs_projections(self) -> bool:
        return self in (Role.ALL, Role.PROJECTIONS)


class OpenTurnsSource:
    """The worker's work source: the open-turns read model, paged."""

    def __init__(self, read_models: ReadModels) -> None:
        self.read_models = read_models

    def catch_up(self, timeout: float) -> bool:
        head = self.read_models.events.head()
        return self.read_models.wait_for(head, timeout, names=["open_turns"])

    def open_turns(self, limit: int) -> Sequence[OpenTurnRef]:
        refs: list[OpenTurnRef] = []
        cursor = None
        while len(refs) < limit:
            rows, cursor = self.read_models.list_open_turns(
                None, min(limit - len(refs), 500), cursor
            )
            refs += [
                OpenTurnRef(str(r["session_id"]), str(r["turn_id"]), str(r["state"])) for r in rows
            ]
            if not cursor:
                break
        return refs


@dataclass
class Parts:
    """The runtime, read models, projection supervisor and worker of one process."""

    settings: Settings
    role: Role
    runtime: Runtime | None = None
    worker_concurrency: int = 4
    read_models: ReadModels | None = None
    supervisor: ProjectionSupervisor | None = None
    worker: Worker | None = None
    # The one LISTEN connection of the process, and its one reader of the log's tail.
    follower: LogFollower | None = None
    # Told about every model call, tool call and turn this process runs (metrics).
    observer: Observer | None = None
    _owns_runtime: bool = field(default=False, repr=False)

    def start(self) -> None:
        """Build and start what the role needs; blocking. Raises when the database is down."""
        if self.runtime is None:
            self.runtime = build_runtime(self.settings)
            self._owns_runtime = True
        if self.observer is not None:
            self.runtime.executor.observer = self.observer
        try:
            self._start_rest(self.runtime)
        except BaseException:
            self.stop(drain_timeout=0)
            raise

    def _start_rest(self, runtime: Runtime) -> None:
        if self.follower is None:
            self.follower = LogFollower(runtime.sessions, runtime.db)
            self.follower.start()
        # Both share the Sessions application's pool: fewer connections per process.
        if self.read_models is None:
            self.read_models = ReadModels(runtime.db, self.settings, sessions=runtime.sessions)
        if self.role.runs_projections and self.supervisor is None:
            self.supervisor = ProjectionSupervisor(
                self.settings, runtime.db, sessions=runtime.sessions, follower=self.follower
            )
            self.supervisor.start()
        if self.role.runs_worker and self.worker is None:
            self.worker = Worker(
                runtime,
                OpenTurnsSource(self.read_models),
                self.worker_concurrency,
                follower=self.follower,
            )
            summary = self.worker.start()
            with bound(worker_id=self.worker.worker_id):
                log.info("worker %s started: %s", self.worker.worker_id, summary)

    def stop(self, drain_timeout: float = 30.0) -> None:
        """Stop in reverse order: worker (drained), projections, then the runtime."""
        if self.worker is not None:
            if not self.worker.stop(drain_timeout=drain_timeout):
                log.warning("a turn was still busy after %.0fs; left for recovery", drain_timeout)
            self.worker = None
        if self.supervisor is not None:
            self.supervisor.stop()
            self.supervisor = None
        if self.follower is not None:
            self.follower.stop()
            self.follower = None
        if self.read_models is not None:
            self.read_models.close()
            self.read_models = None
        if self.runtime is not None and self._owns_runtime:
            self.runtime.close()
            self.runtime = None

    def checks(self) -> dict[str, bool]:
        """What /readyz reports besides the database."""
        checks = {"started": self.runtime is not None}
        if self.role.runs_projections:
            checks["projections"] = _running(self.supervisor)
        if self.role.runs_worker:
            checks["worker"] = self.worker is not None
        return checks


def _running(supervisor: ProjectionSupervisor | None) -> bool:
    """Every runner of this process is leading or standing by (none is failing)."""
    if supervisor is None:
        return False
    runners = supervisor.runners()
    return bool(runners) and all(r["state"] in ("active", "standby") for r in runners)
