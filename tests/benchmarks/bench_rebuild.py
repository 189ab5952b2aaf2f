"""Rebuild throughput against the library's per-event ProjectionRunner, on the same log.

    python tests/benchmarks/bench_rebuild.py [--events 50000] [--models sessions]

Builds a log of real encoded events (Session aggregates driven through their
own commands, saved through the Sessions application's mapper and recorder)
in a fresh namespace, then, for each read model, measures in the same run:

- baseline: the library's ``ProjectionRunner`` driving the same projection
  and view class, one transaction per event, catching up from position 0;
- ours: ``projections.rebuild`` (batches, one tracking update per batch).

Reports events/s for both and their ratio, checks both produced the same
rows, and exits 1 if a ratio is under the target. Uses the test database
(the embedded server under .turnlog/test, or TURNLOG_TEST_DATABASE_URL).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from eventsourcing.projection import ProjectionRunner  # noqa: E402
from psycopg import sql  # noqa: E402

from tests.histories import bulk_history  # noqa: E402
from turnlog.application.sessions import Sessions  # noqa: E402
from turnlog.application.settings import Settings  # noqa: E402
from turnlog.application.store import database  # noqa: E402
from turnlog.application.store.logorder import Place  # noqa: E402
from turnlog.interface.bootstrap import open_sessions  # noqa: E402
from turnlog.projections.catalog import ReadModel, read_models  # noqa: E402
from turnlog.projections.log import EventLog  # noqa: E402
from turnlog.projections.rebuild import compare, rebuild  # noqa: E402

TARGET_RATIO = 10.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--models", nargs="*", default=["sessions"], help="read models to measure")
    args = parser.parse_args()

    url = os.environ.get("TURNLOG_TEST_DATABASE_URL")
    settings = Settings(
        database_url=url,
        data_dir=ROOT / ".turnlog" / "test",
        namespace=f"bench_{uuid.uuid4().hex[:10]}",
    )
    db = database.locate(settings)
    settings = settings.model_copy(update={"database_url": db.conninfo})
    events = EventLog(open_sessions(settings, db))
    try:
        started = time.monotonic()
        saved = bulk_history(events.sessions, args.events)
        seconds = time.monotonic() - started
        print(f"log: {saved} events in {seconds:.1f}s (namespace {settings.namespace})")
        ok = all(measure(model, events, db, settings) for model in read_models(args.models))
    finally:
        events.sessions.close()
        drop(db, settings.schema_name)
    return 0 if ok else 1


def measure(model: ReadModel, events: EventLog, db: database.Database, settings: Settings) -> bool:
    head = events.head()
    total = events.count_after(Place.start())
    baseline = baseline_seconds(model, db, settings, head)
    ours = rebuild(events, db, settings.namespace, [model])
    base_rate, our_rate = total / baseline, ours.events / ours.seconds
    ratio = our_rate / base_rate
    same = same_rows(model, events)
    print(
        f"{model.name}: {total} events | library ProjectionRunner (per event) {base_rate:,.0f} ev/s"
        f" ({baseline:.1f}s) | rebuild (batches) {our_rate:,.0f} ev/s ({ours.seconds:.2f}s)"
        f" | ratio {ratio:.1f}x (target >= {TARGET_RATIO:.0f}x) | same rows: {same}"
    )
    return same and ratio >= TARGET_RATIO


class _Baseline:
    """A copy of a read model under another name, so its tables are separate."""

    @staticmethod
    def projection(model: ReadModel) -> type:
        return type(
            f"Bench{model.projection.__name__}",
            (model.projection,),
            {"name": f"bench_{model.projection.name}"},
        )


def baseline_seconds(
    model: ReadModel, db: database.Database, settings: Settings, head: int
) -> float:
    """Time for the library's ProjectionRunner to catch up from 0 to ``head``."""
    projection_class = _Baseline.projection(model)
    env = database.library_env(db, settings, create_table=True)
    started = time.monotonic()
    with ProjectionRunner(
        application_class=Sessions,
        projection_class=projection_class,
        view_class=model.view,
        env=env,
    ) as runner:
        while (runner.view.max_tracking_id(Sessions.name) or 0) < head:
            runner.run_forever(timeout=0.05)  # re-raises a processing error, if any
        return time.monotonic() - started


def same_rows(model: ReadModel, events: EventLog) -> bool:
    ours = model.postgres_view(events.datastore)
    theirs = model.view(events.datastore, tracking_table_name=f"bench_{model.tracking_table}")
    _, mine = ours.snapshot(events.application_name)
    _, baseline = theirs.snapshot(events.application_name)
    return not compare(model.table, mine, baseline)


def drop(db: database.Database, schema: str) -> None:
    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


if __name__ == "__main__":
    sys.exit(main())
