"""What the app keeps for its lifetime: the process and the shared helpers."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from turnlog.application.errors import DatabaseUnavailable
from turnlog.application.purge_watch import PurgeWatch
from turnlog.application.quotas import QuotaGate
from turnlog.application.retention import RetentionJob
from turnlog.application.store.database import stored_bytes
from turnlog.application.store.history import History
from turnlog.interface.bootstrap import Process
from turnlog.interface.http.metrics import Metrics
from turnlog.interface.http.streams import StreamSlots
from turnlog.interface.http.waits import TurnWaits
from turnlog.projections import ReadModels


@dataclass(frozen=True)
class Options:
    """Limits and timings of the HTTP layer (tests shorten them)."""

    max_streams: int = 64
    max_waits: int = 256  # concurrent ?wait= requests
    heartbeat_seconds: float = 15.0
    min_position_timeout: float = 5.0
    start_retry_seconds: float = 2.0
    drain_timeout: float = 30.0
    max_body_bytes: int = 1024 * 1024


@dataclass
class AppState:
    """Everything the routes reach through dependencies."""

    process: Process
    options: Options
    streams: StreamSlots
    metrics: Metrics
    draining: threading.Event = field(default_factory=threading.Event)
    start_error: BaseException | None = None
    history: History | None = None
    retention: RetentionJob | None = None  # TURNLOG_RETENTION_DAYS's background job
    purges: PurgeWatch | None = None  # forgets sessions other processes purged
    quota: QuotaGate | None = None  # the namespace's quotas (with a tenants file)
    waits: TurnWaits = field(init=False)

    def __post_init__(self) -> None:
        self.waits = TurnWaits(self.options.max_waits)


@dataclass
class StateCounts:
    """A namespace's use, as its quotas count it (``application.quotas``)."""

    state: AppState

    def running_turns(self) -> int:
        reads = self._reads()
        return reads.count_open_turns("queued") + reads.count_open_turns("running")

    def sessions(self) -> int:
        return self._reads().count_sessions()

    def stored_bytes(self) -> int:
        runtime = self.state.process.runtime
        if runtime is None:
            raise DatabaseUnavailable("the namespace is not started yet")
        return stored_bytes(runtime.db, runtime.settings.namespace)

    def _reads(self) -> ReadModels:
        reads = self.state.process.read_models
        if reads is None:
            raise DatabaseUnavailable("the namespace's read models are not started yet")
        return reads
