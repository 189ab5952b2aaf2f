"""The purger of a process, put together from its runtime and its read models.

``TURNLOG_PURGE_PAUSE=<step>`` (one of ``application.purge.STEPS``) makes a
purge stop after that step and wait there until the process is killed: the
fault tests kill a purge halfway with it. Read when a purger is built,
never at import time.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable

from turnlog.application.purge import STEPS, Purger
from turnlog.application.retention import Retention, RetentionJob
from turnlog.application.runtime import Runtime
from turnlog.projections.purging import closed_before, reads_settler
from turnlog.projections.queries import ReadModels

PAUSE_ENV = "TURNLOG_PURGE_PAUSE"

log = logging.getLogger("turnlog.purge")


def build_purger(runtime: Runtime, reads: ReadModels) -> Purger:
    """A purger of the runtime's namespace (see ``application.purge``)."""
    return Purger(
        runtime.sessions,
        runtime.db,
        runtime.settings.sandbox_root,
        try_lease=runtime.leases.try_acquire,
        settle_reads=reads_settler(reads),
        pause=_pause_at(os.environ.get(PAUSE_ENV, "")),
    )


def build_retention(runtime: Runtime, reads: ReadModels, days: int) -> Retention:
    """The namespace's retention policy: purge sessions closed over ``days`` days ago."""
    return Retention(days, build_purger(runtime, reads), closed_before(reads))


def retention_job(runtime: Runtime, reads: ReadModels) -> RetentionJob | None:
    """The background job of ``serve`` (None when TURNLOG_RETENTION_DAYS is unset)."""
    days = runtime.settings.retention_days
    if days is None:
        return None
    retention = build_retention(runtime, reads, days)
    return RetentionJob(retention, runtime.db, runtime.settings.namespace)


def _pause_at(step: str) -> Callable[[str], None]:
    if step not in STEPS:
        return _no_pause

    def pause(reached: str) -> None:
        if reached == step:
            print(f"purge paused after {step}", file=sys.stderr, flush=True)
            threading.Event().wait()  # until the process is killed

    return pause


def _no_pause(step: str) -> None:
    return None
