"""Benchmarks 1 and 2: turns per second, against raw psycopg with the same commit points.

A turn here is the fixture provider with one tool call: TurnSubmitted |
TurnClaimed | ModelReplied | ToolCallStarted | ToolCallSucceeded |
ModelReplied + TurnCompleted — seven durable steps' worth of events in six
commits, as the agent loop records them. The baseline writes rows of the
same sizes with the same commit points through plain psycopg (one INSERT per
event, one transaction per durable step).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from eventsourcing.application import Application  # noqa: E402
from eventsourcing.domain import Aggregate, event  # noqa: E402
from psycopg import sql  # noqa: E402

from turnlog.application.settings import Settings  # noqa: E402
from turnlog.application.store.database import Database, locate  # noqa: E402

TOOL_MESSAGE = '/tool echo {"text": "benchmark"}'


def base_database() -> Database:
    url = os.environ.get("TURNLOG_TEST_DATABASE_URL") or os.environ.get("TURNLOG_DATABASE_URL")
    if url:
        return locate(Settings(database_url=url))
    return locate(Settings(data_dir=ROOT / ".turnlog" / "bench"))


def bench_settings(db: Database, namespace: str) -> Settings:
    return Settings(
        database_url=db.conninfo,
        namespace=namespace,
        data_dir=ROOT / ".turnlog" / "bench-data",
    )


def drop_schema(db: Database, schema: str) -> None:
    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


# --------------------------------------------------------------- turnlog


def turnlog_turns(
    db_conninfo: str,
    namespace: str,
    turns: int,
    barrier: Any = None,
    turn: Callable[[Any, uuid.UUID], None] | None = None,
) -> float:
    """Run ``turns`` turns (``run_turn`` unless told) in one new session; the elapsed seconds."""
    from turnlog.interface.bootstrap import build_runtime

    db = Database(params=dict(psycopg.conninfo.conninfo_to_dict(db_conninfo)), embedded=False)
    rt = build_runtime(bench_settings(db, namespace))
    one = turn or run_turn
    try:
        session_id = rt.sessions.create_session(tools=["echo"]).session_id
        return timed(lambda: one(rt, session_id), turns, barrier)
    finally:
        rt.close()


def timed(turn: Callable[[], None], turns: int, barrier: Any = None) -> float:
    """Seconds for ``turns`` calls of ``turn``, after one warm-up (and the barrier, if any)."""
    turn()
    if barrier is not None:
        barrier.wait()
    start = time.perf_counter()
    for _ in range(turns):
        turn()
    return time.perf_counter() - start


def run_turn(rt: Any, session_id: uuid.UUID) -> None:
    """One turn submitted and run here, the claim in the submission's save (no lease)."""
    _, turn = rt.executor.submit_and_run(session_id, TOOL_MESSAGE)
    assert turn is not None and turn.state == "completed", turn


def sent_turn(rt: Any, session_id: uuid.UUID) -> None:
    """One turn as ``turnlog sessions send`` runs it: ``Runtime.send``, holding the lease."""
    sent = rt.send(session_id, TOOL_MESSAGE)
    assert sent.turn.state == "completed", sent.turn


def worker_turn(rt: Any, session_id: uuid.UUID) -> None:
    """One turn submitted, then claimed in a save of its own, as a worker runs another's."""
    submitted = rt.sessions.submit_turn(session_id, TOOL_MESSAGE)
    turn = rt.executor.run_turn(session_id, submitted.turn_id)
    assert turn.state == "completed", turn


# -------------------------------------------------------------- baseline

# Payload sizes close to what the library stores for each step (JSON bytes).
STEP_PAYLOADS = [[300], [200], [420], [260], [230], [330, 230]]


def raw_setup(db: Database, schema: str) -> None:
    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {}.events (originator_id uuid NOT NULL,"
                " originator_version bigint NOT NULL, topic text NOT NULL, state bytea,"
                " notification_id bigserial, PRIMARY KEY (originator_id, originator_version))"
            ).format(sql.Identifier(schema))
        )
        conn.execute(
            sql.SQL(
                "CREATE UNIQUE INDEX IF NOT EXISTS events_nid ON {}.events (notification_id)"
            ).format(sql.Identifier(schema))
        )


def raw_turns(db_conninfo: str, schema: str, turns: int, barrier: Any = None) -> float:
    insert = sql.SQL(
        "INSERT INTO {}.events (originator_id, originator_version, topic, state)"
        " VALUES (%s, %s, %s, %s)"
    ).format(sql.Identifier(schema))
    with psycopg.connect(db_conninfo) as conn:
        session_id = uuid.uuid4()
        version = 0

        def turn() -> None:
            nonlocal version
            for step in STEP_PAYLOADS:
                with conn.transaction():
                    for size in step:
                        version += 1
                        conn.execute(
                            insert,
                            (session_id, version, "turnlog.session.Step.v1", b"x" * size),
                            prepare=True,
                        )

        return timed(turn, turns, barrier)


# ------------------------------------------------- the library's own ceiling


class Bare(Aggregate):
    """An aggregate with one kind of event and no rules: the library's cost, nothing more."""

    @event("Stepped")
    def step(self, data: str) -> None:
        self.last = data


class Library(Application[uuid.UUID]):
    name = "LibraryCeiling"


def library_turns(db_conninfo: str, schema: str, turns: int, barrier: Any = None) -> float:
    """The same turn through the eventsourcing library alone: an aggregate, same commit points.

    One ``Application.save`` per durable step of a bare aggregate whose events
    carry payloads of the baseline's sizes, on the library's own PostgreSQL
    recorder (its defaults: no pre-ping). No turnlog code runs: this is what any
    runtime built on the library pays at these commit points, a ceiling for
    figure 1's ratio.
    """
    app = Library(env={**library_env(db_conninfo, schema), "CREATE_TABLE": "no"})
    try:
        aggregate = Bare()
        app.save(aggregate)

        def turn() -> None:
            for step in STEP_PAYLOADS:
                for size in step:
                    aggregate.step("x" * size)
                app.save(aggregate)

        return timed(turn, turns, barrier)
    finally:
        app.close()


def library_setup(db: Database, schema: str) -> None:
    """The schema and the library's tables, made once before processes share them."""
    raw_setup(db, schema)
    Library(env=library_env(db.conninfo, schema)).close()


def library_env(db_conninfo: str, schema: str) -> dict[str, str]:
    params = psycopg.conninfo.conninfo_to_dict(db_conninfo)
    return {
        "PERSISTENCE_MODULE": "eventsourcing.postgres",
        "POSTGRES_DBNAME": str(params.get("dbname", "postgres")),
        "POSTGRES_HOST": str(params.get("host", "127.0.0.1")),
        "POSTGRES_PORT": str(params.get("port", 5432)),
        "POSTGRES_USER": str(params.get("user", "postgres")),
        "POSTGRES_PASSWORD": str(params.get("password", "")),
        "POSTGRES_SCHEMA": schema,
        "POSTGRES_POOL_SIZE": "1",
    }


# ------------------------------------------------------------ processes


def _worker(kind: str, conninfo: str, target: str, turns: int, barrier: Any, out: Any) -> None:
    fn = turnlog_turns if kind == "turnlog" else raw_turns
    out.put(fn(conninfo, target, turns, barrier))


def concurrent_rate(kind: str, db: Database, target: str, procs: int, turns: int) -> float:
    """Total turns/s with ``procs`` processes, each driving its own session."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(procs)
    out = ctx.Queue()
    workers = [
        ctx.Process(target=_worker, args=(kind, db.conninfo, target, turns, barrier, out))
        for _ in range(procs)
    ]
    for w in workers:
        w.start()
    elapsed = [out.get(timeout=600) for _ in workers]
    for w in workers:
        w.join()
    return procs * turns / max(elapsed)
