"""Figure 16: WAL per turn late in a session against early in it.

    .venv/bin/python -m tests.benchmarks.bench_wal [--repeat N] [--no-keys] [--json]

One session, figure 1's turn (the application API and the agent loop in this
process: a tool call and a final reply), each submitted with an
``Idempotency-Key`` as the clients send one. WAL bytes per turn are the
server's ``pg_current_wal_lsn()`` difference over turns 1-200 and over
turns 1,001-1,200, each window begun with a ``CHECKPOINT`` so that both pay
the same full-page writes; the ratio is late over early. The WAL is the
server's: nothing else may write to it meanwhile (the embedded server of
``make bench`` is the process's own). Also printed: the latest snapshot's
stored state (bytes) at the end of each window.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql

from tests.benchmarks import bench_turns
from tests.benchmarks.bench_throughput import Config
from tests.benchmarks.suite import Figure, Row, Stat, bench_database, fmt, scratch_namespace
from turnlog.application.store.database import Database

WINDOW = 200
LATE_FROM = 1001  # the first turn of the late window


def _lsn(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


def _checkpoint(conn: psycopg.Connection[Any]) -> bool:
    try:
        conn.execute("CHECKPOINT")
        return True
    except psycopg.errors.InsufficientPrivilege:
        return False


def _snapshot_bytes(conn: psycopg.Connection[Any], schema: str, session_id: UUID) -> int:
    row = conn.execute(
        sql.SQL(
            "SELECT coalesce(octet_length(state), 0) FROM {}.sessions_snapshots"
            " WHERE originator_id = %s ORDER BY originator_version DESC LIMIT 1"
        ).format(sql.Identifier(schema)),
        (session_id,),
    ).fetchone()
    return int(row[0]) if row else 0


def one_session(db: Database, keys: bool = True) -> dict[str, Any]:
    """One run: WAL per turn over both windows of one new session, and snapshot sizes."""
    from turnlog.interface.bootstrap import build_runtime

    last = LATE_FROM + WINDOW - 1
    with (
        scratch_namespace(db, "wal") as settings,
        psycopg.connect(db.conninfo, autocommit=True) as conn,
    ):
        rt = build_runtime(bench_turns.bench_settings(db, settings.namespace))
        try:
            session_id = rt.sessions.create_session(tools=["echo"]).session_id

            def turn(n: int) -> None:
                key = f"turn-{n}" if keys else ""
                submitted = rt.sessions.submit_turn(session_id, bench_turns.TOOL_MESSAGE, key)
                done = rt.executor.run_turn(session_id, submitted.turn_id)
                assert done.state == "completed", done

            wal: dict[str, float] = {}
            snapshot: dict[str, int] = {}
            checkpointed = True
            start = 0
            for n in range(1, last + 1):
                if n in (1, LATE_FROM):
                    checkpointed = _checkpoint(conn) and checkpointed
                    start = _lsn(conn)
                turn(n)
                if n in (WINDOW, last):
                    name = "early" if n == WINDOW else "late"
                    wal[name] = (_lsn(conn) - start) / WINDOW
                    snapshot[name] = _snapshot_bytes(conn, settings.schema_name, session_id)
        finally:
            rt.close()
    return {
        "wal_per_turn": wal,
        "ratio": wal["late"] / wal["early"],
        "snapshot_bytes": snapshot,
        "checkpointed": checkpointed,
        "keys": keys,
    }


def runs(db: Database, repeat: int, keys: bool = True) -> list[dict[str, Any]]:
    return [one_session(db, keys) for _ in range(repeat)]


def figure_16(db: Database, cfg: Config) -> Figure:
    results = runs(db, cfg.pick(cfg.repeat, 1))
    late = [r["wal_per_turn"]["late"] for r in results]
    early = [r["wal_per_turn"]["early"] for r in results]
    ratios = [r["ratio"] for r in results]
    ratio = statistics.median(ratios)
    snaps = results[-1]["snapshot_bytes"]
    return Figure(
        16,
        "WAL per turn, turns 1,001-1,200 vs turns 1-200 of one session",
        [
            Row(
                "16",
                "WAL bytes per turn, turns 1,001-1,200 vs 1-200 (one session, keyed turns)",
                Stat(late, "B/turn"),
                Stat(early, "B/turn"),
                ratio,
                "≤ 1.3x",
                ratio <= 1.3,
            )
        ],
        how=(
            "One session of figure 1's turns (in process, each submitted with an"
            " `Idempotency-Key`), 1,200 turns; `pg_current_wal_lsn()` before and after turns"
            " 1-200 and turns 1,001-1,200, each window begun with a `CHECKPOINT`; bytes per"
            f" turn, late over early, the median of {len(results)} sessions (ratios"
            f" {', '.join(fmt(r) for r in ratios)}). The latest snapshot's state was"
            f" {fmt(snaps['early'] / 1e3)} kB after turn 200 and"
            f" {fmt(snaps['late'] / 1e3)} kB after turn 1,200."
            " `python -m tests.benchmarks.bench_wal`."
        ),
        details={"runs": results},
    )


def describe(result: dict[str, Any]) -> str:
    wal, snap = result["wal_per_turn"], result["snapshot_bytes"]
    return (
        f"WAL/turn early {fmt(wal['early'])} B, late {fmt(wal['late'])} B,"
        f" ratio {result['ratio']:.2f}x; snapshot {fmt(snap['early'])} B ->"
        f" {fmt(snap['late'])} B"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="sessions, one after another")
    parser.add_argument("--no-keys", action="store_true", help="submit without idempotency keys")
    parser.add_argument("--json", action="store_true", help="one JSON object per run")
    args = parser.parse_args(argv)
    db = bench_database()
    ratios = []
    for _ in range(args.repeat):
        result = one_session(db, keys=not args.no_keys)
        ratios.append(result["ratio"])
        print(json.dumps(result) if args.json else describe(result), flush=True)
    if not args.json:
        print(
            f"ratio late/early: median {statistics.median(ratios):.2f}x,"
            f" min {min(ratios):.2f}x, max {max(ratios):.2f}x over {len(ratios)} sessions"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
