"""The console's worker board: a worker silent for long is shown gone, not silent for ever."""

from __future__ import annotations

from psycopg import sql

from turnlog.application.runtime import Runtime
from turnlog.application.store.database import connect
from turnlog.application.store.workers_registry import register_worker, workers_table
from turnlog.interface.console.board import workers


def test_a_worker_silent_past_a_minute_is_gone_and_a_recent_one_silent(runtime: Runtime) -> None:
    ns = runtime.settings.namespace
    for worker_id, age in (("w-working", 0), ("w-silent", 30), ("w-gone", 3600)):
        register_worker(runtime.db, ns, worker_id, 1)
        with connect(runtime.db) as conn:
            conn.execute(
                sql.SQL(
                    "UPDATE {} SET heartbeat_at = now() - make_interval(secs => %s)"
                    " WHERE worker_id = %s"
                ).format(workers_table(ns)),
                (age, worker_id),
            )

    board = workers(runtime)

    conditions = {w["worker_id"]: w["condition"] for w in board["items"]}
    assert conditions == {"w-working": "working", "w-silent": "silent", "w-gone": "gone"}
    assert [w["worker_id"] for w in board["items"]] == ["w-working", "w-silent", "w-gone"]
    assert board["working"] == 1
