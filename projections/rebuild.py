"""Rebuilding read models from position 0, and verifying them against the log.

Rebuild holds the read models' runner locks (so no runner writes meanwhile),
resets each view (rows and position deleted in one transaction; the
tracking table is never truncated), then folds the log in batches: many
events per transaction and one tracking update per batch. It reads the log
in its order and below the commit horizon, up to the head's place when it
started (events committed later are left to the runners). Events committed
before it started but held back by an older transaction still running (any
client of the server) are waited for, up to ``horizon_wait`` seconds, saying
who holds them; past that the rebuild stops short and says so, and the
runners fold the rest once the transaction ends. A standby runner takes over
from the rebuilt place when the locks are released.

Verify folds the log in memory up to each read model's position, with the
same projection code, and compares the result with the live table row by
row. It reads the live table and its position in one snapshot, so it can run
while a runner is writing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from turnlog.application.errors import ProjectionBusy
from turnlog.application.store.database import Database, connect
from turnlog.application.store.logorder import Place, place_of_tracking
from turnlog.projections.catalog import ReadModel
from turnlog.projections.leadership import STANDBY_INTERVAL, projection_lock_key
from turnlog.projections.log import EventLog, create_tables
from turnlog.projections.rows import Key, Row, Table
from turnlog.projections.status import lock_holder
from turnlog.projections.view import Fold, MemoryView, fold_together

REBUILD_BATCH = 2000
VERIFY_BATCH = 5000

Progress = Callable[[int, int], None]
Held = Callable[[dict[str, Any]], None]  # told who holds the horizon back while it waits

HORIZON_WAIT = 60.0  # longest wait for events held back by an older transaction (s)
HORIZON_POLL = 0.05
HELD_NOTICE = 5.0  # seconds between two notices of who holds them back


@dataclass(frozen=True)
class Rebuilt:
    """What a rebuild did: read models, events folded, time taken."""

    names: list[str]
    events: int
    position: int  # of the last event folded
    seconds: float
    # Events committed before the start, still held back past the horizon when the
    # wait ran out (0: the rebuild reached the head it started from).
    held_back: int = 0
    holder: dict[str, Any] = field(default_factory=dict)

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0


@contextmanager
def holding_locks(
    db: Database, namespace: str, models: Sequence[ReadModel], wait: float = 0.0
) -> Iterator[None]:
    """Hold the runner locks of ``models`` (the same ones runners take) on one connection.

    Waits up to ``wait`` seconds for runners to let go; then ``ProjectionBusy``
    naming the holder. Closing the connection releases every lock, also on
    errors and crashes.
    """
    conn = connect(db, application_name=f"turnlog-rebuild {namespace}"[:63])
    try:
        pending = list(models)
        deadline = time.monotonic() + wait
        while True:
            pending = [m for m in pending if not _try_lock(conn, namespace, m.name)]
            if not pending:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                held = ", ".join(
                    f"{m.name} (held by {lock_holder(conn, namespace, m.name) or 'a runner'})"
                    for m in pending
                )
                raise ProjectionBusy(
                    f"a live runner holds {held}; stop it (or wait for it) and rebuild again"
                )
            time.sleep(min(STANDBY_INTERVAL, remaining))
        yield
    finally:
        conn.close()


def _try_lock(conn: Any, namespace: str, name: str) -> bool:
    row = conn.execute(
        "SELECT pg_try_advisory_lock(%s)", (projection_lock_key(namespace, name),)
    ).fetchone()
    return bool(row and row[0])


def rebuild(
    events: EventLog,
    db: Database,
    namespace: str,
    models: Sequence[ReadModel],
    *,
    batch_size: int = REBUILD_BATCH,
    wait: float = 0.0,
    progress: Progress | None = None,
    horizon_wait: float = HORIZON_WAIT,
    held: Held | None = None,
    held_notice: float = HELD_NOTICE,
) -> Rebuilt:
    """Reset ``models`` and fold the whole log into them again, in batches.

    While events wait behind an older transaction, ``held`` is told who holds
    them, at once and then every ``held_notice`` seconds.
    """
    started = time.monotonic()
    report = progress or (lambda done, total: None)
    holder: dict[str, Any] = {}
    create_tables(db, events, models)
    with holding_locks(db, namespace, models, wait):
        views = [model.postgres_view(events.datastore) for model in models]
        for view in views:
            view.reset(events.application_name)
        workers = [
            (view, model.projection(view)) for model, view in zip(models, views, strict=True)
        ]
        head = events.head_place()  # events recorded from now on are left to the runners
        total = events.count_after(Place.start())
        done = 0
        place = Place.start()
        report(done, total)
        waiting_since: float | None = None
        noticed = 0.0
        while place < head:
            page = events.read(place, batch_size, stop=head)
            if not page.records and not page.pending:
                break  # nothing left below the head (defensive: the head is committed)
            if not page.records:
                # Committed before we began, held back by an older transaction: wait.
                now = time.monotonic()
                waiting_since = now if waiting_since is None else waiting_since
                if now - waiting_since >= horizon_wait:
                    holder = events.horizon()
                    break  # left to the runners, and said so
                if held is not None and (noticed == 0.0 or now - noticed >= held_notice):
                    noticed = now
                    held(events.horizon())
                time.sleep(HORIZON_POLL)
                continue
            waiting_since, noticed = None, 0.0
            pairs = events.decode(page.records)
            folds = [Fold(v, p, place, pairs) for v, p in workers]
            fold_together(events.datastore, folds, page.epoch)
            place = page.records[-1][0]
            done += len(page)
            report(done, max(total, done))
        held_back = events.count_after(place) - events.count_after(head) if place < head else 0
    return Rebuilt(
        [m.name for m in models],
        done,
        place.position,
        time.monotonic() - started,
        held_back,
        holder if held_back else {},
    )


@dataclass(frozen=True)
class Difference:
    """One way a live row differs from the row the log folds to."""

    key: Key
    kind: str  # "missing" (only in the fold), "unexpected" (only live), "changed"
    column: str = ""
    live: Any = None
    expected: Any = None

    def describe(self) -> str:
        key = ", ".join(str(k) for k in self.key)
        if self.kind == "missing":
            return f"row ({key}) is missing from the live table"
        if self.kind == "unexpected":
            return f"row ({key}) is in the live table but not in the log's fold"
        return f"row ({key}) column {self.column}: live {self.live!r}, expected {self.expected!r}"


@dataclass
class Verified:
    """The result of verifying one read model."""

    name: str
    position: int  # of the last event the read model processed
    rows: int
    differences: list[Difference] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.differences


def verify(events: EventLog, models: Sequence[ReadModel]) -> list[Verified]:
    """Compare each live read model with an in-memory fold of the log up to its position."""
    snapshots = [
        model.postgres_view(events.datastore).snapshot(events.application_name) for model in models
    ]
    folds = fold_in_memory(events, [(m, p) for m, (p, _) in zip(models, snapshots, strict=True)])
    return [
        Verified(model.name, place.position, len(live), compare(model.table, live, fold.rows.all()))
        for model, (place, live), fold in zip(models, snapshots, folds, strict=True)
    ]


def fold_in_memory(
    events: EventLog,
    targets: Sequence[tuple[ReadModel, Place]],
    *,
    batch_size: int = VERIFY_BATCH,
) -> list[MemoryView]:
    """Fold the log into in-memory views, each up to its own place; one pass over the log.

    A read model's place was reached below the horizon, so every event up to
    it is readable now.
    """
    views = [model.memory_view() for model, _ in targets]
    projections = [model.projection(view) for (model, _), view in zip(targets, views, strict=True)]
    stop = max((place for _, place in targets), default=Place.start())
    place = Place.start()
    while place < stop:
        page = events.read(place, batch_size, stop=stop)
        if not page.records:
            break
        for event, tracking in events.decode(page.records):
            for (_, upto), projection in zip(targets, projections, strict=True):
                if place_of_tracking(tracking) <= upto:
                    projection.process_event(event, tracking)
        place = page.records[-1][0]
    return views


def compare(table: Table, live: Sequence[Row], expected: Sequence[Row]) -> list[Difference]:
    """Row-by-row differences between live rows and expected rows, by primary key."""
    live_rows = {table.key_of(r): r for r in live}
    expected_rows = {table.key_of(r): r for r in expected}
    differences = []
    for key in sorted(live_rows.keys() | expected_rows.keys(), key=str):
        have, want = live_rows.get(key), expected_rows.get(key)
        if have is None:
            differences.append(Difference(key, "missing"))
        elif want is None:
            differences.append(Difference(key, "unexpected"))
        else:
            differences.extend(
                Difference(key, "changed", name, have.get(name), want.get(name))
                for name in table.names
                if have.get(name) != want.get(name)
            )
    return differences
