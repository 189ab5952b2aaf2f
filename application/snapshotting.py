"""The Sessions application's snapshots: taken from the object just saved, pruned after.

A snapshot is a cache of state the events already hold, so dropping a
superseded one loses nothing; the events are never touched.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from eventsourcing.application import ProcessingEvent

from turnlog.application.store import session_log
from turnlog.domain.session import Session


def take(app: Any, processing_event: ProcessingEvent[UUID]) -> None:
    """Snapshot the sessions just saved, from memory, when a save crosses an interval.

    The library's default reloads the aggregate from the store to snapshot
    it; the object in hand is exactly what was just saved, so use it.
    """
    if app.snapshots is None:
        return
    interval = app.snapshotting_intervals.get(Session)
    if not interval:
        return
    crossed = {
        e.originator_id for e in processing_event.events if e.originator_version % interval == 0
    }
    snapshots = [
        Session.Snapshot.take(aggregate)
        for aggregate_id, aggregate in processing_event.aggregates.items()
        if aggregate_id in crossed and isinstance(aggregate, Session)
    ]
    if snapshots:
        app.snapshots.put(snapshots)
        for snapshot in snapshots:
            app.prune_snapshots(snapshot.originator_id)


def prune(app: Any, session_id: UUID) -> int:
    """Delete a session's snapshots but the latest ``app.snapshot_keep``; returns how many."""
    recorder: Any = app.snapshots.recorder if app.snapshots is not None else None
    if not session_log.on_postgres(recorder):
        return 0  # in-memory persistence (unit tests): nothing to prune
    return int(session_log.prune(recorder, session_id, app.snapshot_keep))
