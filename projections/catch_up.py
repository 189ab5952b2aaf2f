"""Bringing a read model up to the log's head before reading it, whatever else runs.

A read model is kept current only while some process runs its runner. A
command that must tell the truth now (``turnlog check``) cannot rely on
that: it first notes how far behind the read model is, then either folds
the missing events itself — holding the runner lock, so no runner writes
meanwhile — or, when a live runner holds the lock, waits (bounded) for that
runner to get there.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from turnlog.application.store.database import Database, connect
from turnlog.application.store.logorder import Place
from turnlog.projections.catalog import ReadModel
from turnlog.projections.leadership import projection_lock_key
from turnlog.projections.log import EventLog
from turnlog.projections.status import lock_holder
from turnlog.projections.view import fold_batch

BATCH = 2000
POLL_SECONDS = 0.05


@dataclass(frozen=True)
class CaughtUp:
    """How far behind a read model was, and who brought it to the head."""

    name: str
    head: int  # the log's head when the catch-up began
    position_before: int
    position_after: int
    behind_events: int  # events it had not processed yet
    by: str  # "" (it was current), "this process", or the runner that holds it
    # Whether it had reached ``head`` when the catch-up ended (compared in the
    # log's order: positions alone are not in commit order).
    current: bool

    def describe(self) -> str:
        if self.behind_events == 0:
            return f"{self.name} read model was current (position {self.position_after})"
        where = f"{self.behind_events} event(s) behind (position {self.position_before} of"
        where += f" {self.head})"
        if self.current:
            return f"{self.name} read model was {where}; caught up by {self.by}"
        return (
            f"{self.name} read model was {where}; still at {self.position_after} after waiting"
            f" for {self.by}: what it lists may be out of date"
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def catch_up(
    events: EventLog, db: Database, namespace: str, model: ReadModel, wait: float = 10.0
) -> CaughtUp:
    """Bring ``model`` to the log's current head: fold the events here, or wait for its runner."""
    view = model.postgres_view(events.datastore)
    head = events.head_place()  # places: the log's order (application.store.logorder)
    before = view.position(events.application_name)
    if before >= head:
        return CaughtUp(model.name, head.position, before.position, before.position, 0, "", True)
    behind = events.count_after(before)
    conn = connect(db, application_name=f"turnlog-catch-up {namespace}"[:63])
    try:
        key = projection_lock_key(namespace, model.name)
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
        if row and row[0]:
            # The runner lock is ours: no runner writes this view until we let go.
            projection = model.projection(view)
            place = view.position(events.application_name)
            deadline = time.monotonic() + wait
            while place < head:
                page = events.read(place, BATCH, stop=head)
                if page.records:
                    place = fold_batch(view, projection, place, events.decode(page.records))
                elif time.monotonic() < deadline:
                    time.sleep(POLL_SECONDS)  # the rest waits past the commit horizon
                else:
                    break
            return CaughtUp(
                model.name,
                head.position,
                before.position,
                place.position,
                behind,
                "this process",
                place >= head,
            )
        holder = lock_holder(conn, namespace, model.name) or "a runner"
    finally:
        conn.close()
    return _wait_for_runner(events, view, model.name, head, before, behind, holder, wait)


def _wait_for_runner(
    events: EventLog,
    view: Any,
    name: str,
    head: Place,
    before: Place,
    behind: int,
    holder: str,
    wait: float,
) -> CaughtUp:
    deadline = time.monotonic() + wait
    place = view.position(events.application_name)
    while place < head and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
        place = view.position(events.application_name)
    return CaughtUp(
        name,
        head.position,
        before.position,
        place.position,
        behind,
        f"its runner ({holder})",
        place >= head,
    )
