"""Figures 4 and 5: big logs — serve start-up with 10,000 sessions, and projection rebuild.

Figure 4 uses ``bench_serve_startup`` (seeding, one timed start of `turnlog
serve`). Figure 5 measures ``projections.rebuild`` against the library's
per-event ``ProjectionRunner`` driving the same projection and view classes
over the same log (the approach of ``bench_rebuild``).
"""

from __future__ import annotations

import time
from typing import Any

from eventsourcing.projection import ProjectionRunner
from psycopg import sql

from tests.benchmarks import bench_serve_startup
from tests.benchmarks.bench_throughput import Config
from tests.benchmarks.suite import Figure, Row, Stat, fmt, interleave, scratch_namespace
from tests.histories import bulk_history
from turnlog.application.sessions import Sessions
from turnlog.application.settings import Settings
from turnlog.application.store import database
from turnlog.application.store.database import Database
from turnlog.application.store.logorder import Place
from turnlog.interface.bootstrap import open_sessions
from turnlog.projections.catalog import ReadModel, read_models
from turnlog.projections.log import EventLog
from turnlog.projections.rebuild import rebuild

# ------------------------------------------------------------------ figure 4


def _start(settings: Settings) -> float:
    """Seconds from spawning `turnlog serve --role all` to /readyz answering 200."""
    try:
        ready, _ = bench_serve_startup.start_once(settings)
    except SystemExit as exc:  # the helper exits on failure; the suite goes on
        raise RuntimeError(f"serve did not start: {exc}") from None
    return ready


def figure_4(db: Database, cfg: Config) -> Figure:
    count = cfg.pick(10_000, 1_000)
    with scratch_namespace(db) as small, scratch_namespace(db) as large:
        seeding = time.monotonic()
        bench_serve_startup.seed(small, 10)
        bench_serve_startup.seed(large, count)
        seeding = time.monotonic() - seeding
        _start(small)  # warm the page cache and the interpreter's files once
        big, few = interleave(cfg.repeat, lambda: _start(large), lambda: _start(small))
    t, b = Stat(big, "s"), Stat(few, "s")
    ratio = t.median / b.median
    return Figure(
        4,
        f"start-up until /readyz is 200 with {count:,} stored sessions",
        [
            Row(
                "4",
                f"serve start-up, {count:,} sessions (vs 10)",
                t,
                b,
                ratio,
                "≤ 1.2x",
                ratio <= 1.2,
            )
        ],
        how=(
            f"Two namespaces are seeded through the application: {count:,} sessions and 10,"
            " each session with one completed turn (saved ten at a time), and the read models"
            f" caught up once ({fmt(seeding)} s). Then `turnlog serve --role all` (API, worker,"
            " projection runners) is spawned alternately on each, timing spawn → first 200 from"
            " `/readyz` (polled every 20 ms), then stopped with SIGTERM. One unmeasured start"
            " first warms the OS caches. Includes the interpreter's start and imports, the same"
            " for both."
        ),
        details={"sessions": count, "seeding_seconds": seeding},
    )


# ------------------------------------------------------------------ figure 5


def _baseline_projection(model: ReadModel, tag: str) -> type:
    """A copy of the model's projection under another name, so its tables are its own."""
    return type(
        f"Bench{model.projection.__name__}{tag}",
        (model.projection,),
        {"name": f"bench{tag}_{model.projection.name}"},
    )


def _position_of(events: EventLog, nth: int) -> int:
    """The log position of the ``nth`` event."""
    statement = sql.SQL(
        "SELECT notification_id FROM {}.{} ORDER BY notification_id OFFSET %s LIMIT 1"
    ).format(sql.Identifier(events.schema), sql.Identifier(events.events_table))
    with events.datastore.get_connection() as conn:
        row: Any = conn.execute(statement, (nth - 1,)).fetchone()
    return int(row["notification_id"])


class Baseline:
    """The library's ProjectionRunner from position 0 up to ``stop``: events per second."""

    def __init__(self, db: Database, settings: Settings, events: EventLog, stop: int) -> None:
        self.env = database.library_env(db, settings, create_table=True)
        self.stop = stop
        self.count = events.count_after(Place.start()) - events.count_after(events.place_of(stop))
        self.runs = 0

    def __call__(self, model: ReadModel) -> float:
        self.runs += 1
        projection = _baseline_projection(model, str(self.runs))
        started = time.monotonic()
        with ProjectionRunner(
            application_class=Sessions,
            projection_class=projection,
            view_class=model.view,
            env=self.env,
        ) as runner:
            while (runner.view.max_tracking_id(Sessions.name) or 0) < self.stop:
                runner.run_forever(timeout=0.02)  # re-raises a processing error, if any
            seconds = time.monotonic() - started
        return self.count / seconds


def figure_5(db: Database, cfg: Config) -> Figure:
    size = cfg.pick(100_000, 10_000)
    cap = cfg.pick(2_500, 1_000)
    rows, details = [], {}
    with scratch_namespace(db) as settings:
        events = EventLog(open_sessions(settings, db))
        try:
            seeding = time.monotonic()
            saved = bulk_history(events.sessions, size)
            seeding = time.monotonic() - seeding
            total = events.count_after(Place.start())
            baseline = Baseline(db, settings, events, _position_of(events, cap))
            for letter, model in zip("abc", read_models(), strict=True):
                ours, theirs = interleave(
                    cfg.repeat,
                    lambda m=model: _rebuild_rate(events, db, settings, m),
                    lambda m=model: baseline(m),
                )
                t, b = Stat(ours, "events/s"), Stat(theirs, "events/s")
                ratio = t.median / b.median
                rows.append(
                    Row(
                        f"5{letter}",
                        f"rebuild `{model.name}` over {total:,} events",
                        t,
                        b,
                        ratio,
                        "≥ 10x",
                        ratio >= 10,
                    )
                )
        finally:
            events.sessions.close()
    details.update(events=total, saved=saved, seeding_seconds=seeding, baseline_events=cap)
    return Figure(
        5,
        f"projection rebuild events/s over a {total:,}-event log",
        rows,
        how=(
            f"A log of {total:,} real events (sessions of 8 turns of every ending, driven by the"
            " domain's commands and saved through the application, `tests/histories.py`;"
            f" {fmt(seeding)} s). Ours: `projections.rebuild` of one read model from position"
            " 0 over the whole log (locks, reset, batches of 2,000 events per transaction),"
            " events / wall time. Baseline: the library's `ProjectionRunner` with the same"
            " projection and view classes (under a fresh name, so its own tables), one"
            f" transaction per event, from position 0 over the first {cap:,} events of the"
            " same log (its per-event cost does not depend on the log's length; the full log"
            " would take minutes per run), events / wall time including its start-up. One row"
            " per read model."
        ),
        details=details,
    )


def _rebuild_rate(events: EventLog, db: Database, settings: Settings, model: ReadModel) -> float:
    done = rebuild(events, db, settings.namespace, [model])
    return done.events / done.seconds
