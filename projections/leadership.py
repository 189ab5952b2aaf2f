"""Leading a read model: its advisory lock, its lock connection, its backoff.

For each read model a runner holds a dedicated connection with a
session-level advisory lock keyed by (namespace, read model): only the holder
folds that read model's events; every other process's runner stands by and
tries again every ``STANDBY_INTERVAL``. An error ends a leadership and it is
tried again after a backoff, from ``MIN_BACKOFF`` doubling to ``MAX_BACKOFF``.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

import psycopg
from eventsourcing.projection import Projection

from turnlog.application.store.database import lock_key
from turnlog.application.store.logorder import Place
from turnlog.projections.catalog import ReadModel
from turnlog.projections.view import PostgresReadModelView, ReadModelView

LOCK_NAME = "turnlog:projection"
STANDBY_INTERVAL = 0.5  # how often a standby tries the lock
MIN_BACKOFF = 0.2
MAX_BACKOFF = 5.0
HEALTHY_AFTER = 10.0  # leadership that lasted this long restarts from the minimum backoff


def projection_lock_key(namespace: str, name: str) -> int:
    return lock_key(LOCK_NAME, namespace, name)


def runner_label(name: str) -> str:
    """The lock connection's application_name: what status shows as the holder."""
    return f"turnlog-projection {name} {socket.gethostname()[:24]}:{os.getpid()}"[:63]


@dataclass
class RunnerState:
    """What one runner of this process is doing."""

    name: str
    state: str = "starting"  # standby | active | retrying | stopped
    position: int = 0  # of the last event processed
    restarts: int = 0
    last_error: str = ""


class _Lead:
    """One read model of a runner: its lock connection and, while it leads, its view and place."""

    def __init__(self, model: ReadModel, namespace: str) -> None:
        self.model = model
        self.state = RunnerState(model.name)
        self.key = projection_lock_key(namespace, model.name)
        self.conn: psycopg.Connection[Any] | None = None
        self.view: PostgresReadModelView | None = None
        self.projection: Projection[ReadModelView] | None = None
        self.place = Place.start()  # the last event folded
        self.through = Place.start()  # the log is read up to here
        self.backoff = MIN_BACKOFF
        self.next_try = 0.0  # when to try the lock again (standing by, or after an error)
        self.since = 0.0  # when this leadership (or attempt) began

    @property
    def leading(self) -> bool:
        return self.view is not None
