"""Figures 1, 2 and 7: turns per second, alone and with 8 sessions, and live projection lag.

Built on ``bench_turns`` (a turn of the fixture provider with one tool call,
against raw psycopg with the same events and commit points).
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from tests.benchmarks import bench_turns
from tests.benchmarks.suite import (
    Figure,
    Row,
    Stat,
    drop_schema,
    fmt,
    interleave,
    new_namespace,
    percentile,
    ratio_of,
    scratch_namespace,
)
from tests.fault.cluster import Process, poll
from turnlog.application.settings import schema_name
from turnlog.application.store.database import Database
from turnlog.application.store.logorder import HORIZON, XACT
from turnlog.interface.bootstrap import build_process
from turnlog.projections.catalog import read_models

PROCESSES = 8


@dataclass
class Config:
    """Sizes of one run of the suite (``quick`` shrinks them)."""

    quick: bool = False
    repeat: int = 3
    shared: dict[str, Any] = field(default_factory=dict)  # results figures hand to later ones

    def pick(self, full: int, quick: int) -> int:
        return quick if self.quick else full


class WriterPool:
    """``procs`` spawned processes that run figure-1 turns together, on request.

    Spawned once and reused for every run of a figure, so the runs measure
    turns and not the interpreter's start-up; each run starts at a barrier
    after a warm-up turn, as ``bench_turns.concurrent_rate`` does.
    """

    def __init__(self, db: Database, procs: int = PROCESSES) -> None:
        ctx = mp.get_context("spawn")
        self._barrier = ctx.Barrier(procs)
        self._out: Any = ctx.Queue()
        self._tasks: list[Any] = [ctx.Queue() for _ in range(procs)]
        self._procs = [
            ctx.Process(target=_pool_worker, args=(db.conninfo, q, self._barrier, self._out))
            for q in self._tasks
        ]
        for p in self._procs:
            p.start()

    def rate(self, kind: str, target: str, turns: int) -> float:
        """Total turns/s: all processes' turns over the slowest process's time."""
        for q in self._tasks:
            q.put((kind, target, turns))
        results = [self._out.get(timeout=600) for _ in self._tasks]
        failures = [r for r in results if isinstance(r, str)]
        if failures:
            raise RuntimeError(f"a writer process failed: {failures[0]}")
        return len(results) * turns / max(results)

    def close(self) -> None:
        for q in self._tasks:
            q.put(None)
        for p in self._procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()

    def __enter__(self) -> WriterPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pool_worker(conninfo: str, tasks: Any, barrier: Any, out: Any) -> None:
    while (task := tasks.get()) is not None:
        kind, target, turns = task
        fn = {
            "turnlog": bench_turns.turnlog_turns,
            "library": bench_turns.library_turns,
        }.get(kind, bench_turns.raw_turns)
        try:
            out.put(fn(conninfo, target, turns, barrier))
        except Exception as exc:
            barrier.abort()
            out.put(f"{type(exc).__name__}: {exc}")


# ------------------------------------------------------------------ figure 1


SESSION_TURNS = (150, 40)  # turns per session in figures 1, 2 and 7 (full, quick)


def timed_turns(conninfo: str, namespace: str, turns: int) -> list[float]:
    """``bench_turns.turnlog_turns``, keeping each turn's time (seconds)."""
    from turnlog.interface.bootstrap import build_runtime

    params = dict(psycopg.conninfo.conninfo_to_dict(conninfo))
    rt = build_runtime(bench_turns.bench_settings(Database(params, embedded=False), namespace))
    try:
        session_id = rt.sessions.create_session(tools=["echo"]).session_id
        bench_turns.run_turn(rt, session_id)  # warm-up
        times = []
        for _ in range(turns):
            started = time.perf_counter()
            bench_turns.run_turn(rt, session_id)
            times.append(time.perf_counter() - started)
        return times
    finally:
        rt.close()


def figure_1(db: Database, cfg: Config) -> Figure:
    turns = cfg.pick(*SESSION_TURNS)
    namespace = new_namespace()
    raw_schema = f"raw_{namespace}"
    bench_turns.raw_setup(db, raw_schema)
    lib_schema = f"lib_{namespace}"
    bench_turns.library_setup(db, lib_schema)
    per_turn: list[list[float]] = []
    library: list[float] = []
    paths: dict[str, list[float]] = {"sent": [], "worker": []}

    def ours() -> float:
        per_turn.append(timed_turns(db.conninfo, namespace, turns))
        return turns / sum(per_turn[-1])

    def raw_then_others() -> float:
        rate = turns / bench_turns.raw_turns(db.conninfo, raw_schema, turns)
        library.append(turns / bench_turns.library_turns(db.conninfo, lib_schema, turns))
        for path, turn in (("sent", bench_turns.sent_turn), ("worker", bench_turns.worker_turn)):
            seconds = bench_turns.turnlog_turns(db.conninfo, namespace, turns, turn=turn)
            paths[path].append(turns / seconds)
        return rate

    try:
        mine, raw = interleave(max(cfg.repeat, 5), ours, raw_then_others)
    finally:
        drop_schema(db, schema_name(namespace))
        drop_schema(db, raw_schema)
        drop_schema(db, lib_schema)
    t, b, lib = Stat(mine, "turns/s"), Stat(raw, "turns/s"), Stat(library, "turns/s")
    sent, worker = Stat(paths["sent"], "turns/s"), Stat(paths["worker"], "turns/s")
    cfg.shared["turns_1"] = t.median
    ratio = ratio_of(t, b)
    ceiling = ratio_of(lib, b)
    third = max(1, turns // 3)
    first = statistics.median(third / sum(r[:third]) for r in per_turn)
    last = statistics.median(third / sum(r[-third:]) for r in per_turn)
    return Figure(
        1,
        "turns/s, one session (fixture provider, one tool call per turn)",
        [
            Row("1", "turns/s, 1 session", t, b, ratio, "≥ 0.8x", ratio >= 0.8),
            Row(
                "1c",
                "the eventsourcing library alone at the baseline's 6 commits (the ceiling of a"
                " runtime that saves every step alone)",
                lib,
                b,
                ceiling,
                "report",
                None,
            ),
            Row("1d", "turnlog over the library alone", t, lib, ratio_of(t, lib), "report", None),
            Row(
                "1e",
                "`Runtime.send` (`turnlog sessions send`: the session's lease held, recovery"
                " first)",
                sent,
                b,
                ratio_of(sent, b),
                "report",
                None,
            ),
            Row(
                "1f",
                "submitted, then claimed in a save of its own (a worker's path: 4 saves)",
                worker,
                b,
                ratio_of(worker, b),
                "report",
                None,
            ),
        ],
        how=(
            f"One process drives {turns} turns in one new session through the application API"
            " (`executor.submit_and_run`: the turn submitted and run in this process, the"
            " executor's part of `Runtime.send` without its lease and reads, row 1e; 7 events"
            " in 3 saves per turn: submitted + claimed | model reply + tool started | tool"
            " succeeded + model reply + completed, docs/durability.md), after one warm-up"
            " turn; the runtime"
            " is built outside the timing. Baseline: raw psycopg on one connection, one INSERT"
            " per event (rows of the same sizes), one transaction per step, 6 commits per"
            " turn, each waiting for the disk. Runs alternate turnlog/baseline. A turn's cost"
            f" grows with the session's length: turnlog's median rate over turns 1-{third} was"
            f" {fmt(first)} turns/s, over the last {third} turns {fmt(last)} turns/s."
            " Row 1c runs the same turn through the eventsourcing library alone, with no"
            " turnlog code: a bare aggregate, one `Application.save` per step of the"
            " baseline, the same events and sizes, on the library's PostgreSQL recorder. What"
            " it reaches against raw psycopg bounds any runtime built on the library that"
            " saves every step alone; row 1d is turnlog against that. Rows 1e and 1f run"
            " between the baseline's runs, each in a new session of the same namespace:"
            " 1e through `Runtime.send`, which also takes and gives back the session's lease,"
            " reads the session for a turn to recover before and for a follow-up after, and"
            " checks the lease before the claim and around the tool call (7 more round"
            " trips); 1f as a worker runs a turn another process submitted."
        ),
        details={
            "turns_per_run": turns,
            "rate_first_third": first,
            "rate_last_third": last,
            "library_turns_per_s": lib.median,
        },
    )


# ------------------------------------------------------------------ figure 2


def figure_2(db: Database, cfg: Config) -> Figure:
    turns = cfg.pick(*SESSION_TURNS)
    namespace = new_namespace()
    raw_schema = f"raw_{namespace}"
    lib_schema = f"lib_{namespace}"
    bench_turns.raw_setup(db, raw_schema)
    bench_turns.library_setup(db, lib_schema)
    library: list[float] = []

    def raw_then_library(pool: WriterPool) -> float:
        rate = pool.rate("raw", raw_schema, turns)
        library.append(pool.rate("library", lib_schema, turns))
        return rate

    try:
        with WriterPool(db) as pool:
            ours, raw = interleave(
                cfg.repeat,
                lambda: pool.rate("turnlog", namespace, turns),
                lambda: raw_then_library(pool),
            )
    finally:
        drop_schema(db, schema_name(namespace))
        drop_schema(db, raw_schema)
        drop_schema(db, lib_schema)
    t, b, lib = Stat(ours, "turns/s"), Stat(raw, "turns/s"), Stat(library, "turns/s")
    cfg.shared["turns_8"] = t.median
    ratio = ratio_of(t, b)
    rows = [
        Row("2", "turns/s, 8 sessions (8 processes)", t, b, ratio, "≥ 0.5x", ratio >= 0.5),
        Row(
            "2c",
            "the eventsourcing library alone in 8 processes (its own recorder, table lock)",
            lib,
            b,
            ratio_of(lib, b),
            "report",
            None,
        ),
    ]
    single = cfg.shared.get("turns_1")
    if single:
        scale = t.median / single
        rows.append(
            Row(
                "2b",
                "8-session turns/s over turnlog's own 1-session turns/s",
                t,
                Stat([single], "turns/s"),
                scale,
                "≥ 1.5x",
                scale >= 1.5,
            )
        )
    return Figure(
        2,
        "turns/s with 8 sessions driven concurrently",
        rows,
        how=(
            f"{PROCESSES} processes (spawned once and reused by every run), each building its"
            " own runtime and a new session per run, start together at a barrier after a"
            f" warm-up turn and run {turns} turns each as in figure 1; rate = all turns / the"
            " slowest process's time. Baseline: the raw"
            f" psycopg writer of figure 1 in {PROCESSES} processes. Row 2b compares with"
            " figure 1's turnlog median from the same run. Row 2c runs figure 1's library-only"
            " turn in the same processes: the library's own recorder locks the table on each"
            " insert, which turnlog's does not."
        ),
        details={"turns_per_process": turns, "processes": PROCESSES},
    )


# ------------------------------------------------------------------ figure 7


class LagSampler:
    """Polls the log and the read models' places; lag = first seen → first tracked.

    An event counts as committed at the first poll whose snapshot shows it,
    and as projected at the first poll where every read model's tracking
    place (transaction id, position; see application/store/logorder.py) has
    reached its place (the view rows and the tracking row commit in one
    transaction). Both ends carry one poll interval of uncertainty; the
    intervals are recorded.

    Each poll reads only the rows of transactions at or above the previous
    poll's commit horizon (application/store/logorder.py), through the log-order
    index: every row of an older transaction had committed before that
    poll's snapshot and was seen by it. So a poll costs about the rows of
    the transactions in flight, not a window of thousands of rows; a poll
    that scans thousands of rows every millisecond takes a core from the
    system it measures and stretches its own interval.
    """

    def __init__(self, db: Database, schema: str, sleep: float = 0.001) -> None:
        self._db = db
        self._sleep = sleep
        places = [
            sql.SQL(
                "(SELECT ARRAY[coalesce(xact_id, '0'::xid8)::text, notification_id::text]"
                " FROM {}.{} WHERE application_name = 'Sessions')"
            ).format(sql.Identifier(schema), sql.Identifier(m.tracking_table))
            for m in read_models()
        ]
        self._tracked = sql.SQL("SELECT {}").format(sql.SQL(", ").join(places))
        self._horizon = sql.SQL("SELECT {}::text").format(HORIZON)
        self._rows = sql.SQL(
            "SELECT {xact}::text, notification_id FROM {t} WHERE {xact} >= %s::xid8"
        ).format(xact=XACT, t=sql.Identifier(schema, "sessions_events"))
        self.lags: list[float] = []  # seconds, one per event
        self.intervals: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lag-sampler", daemon=True)
        self._pending: list[tuple[tuple[int, int], float]] = []  # (place, first seen)
        # Commit → readable: below the commit horizon, where log readers read.
        self.horizon_lags: list[float] = []
        self._unreadable: list[tuple[tuple[int, int], float]] = []
        self.caught_up = False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        seen: set[int] = set()
        last_poll = None
        with psycopg.connect(self._db.conninfo, autocommit=True) as conn:
            conn.execute("SET application_name = 'turnlog-bench-lag'")
            horizon = "0"
            while not self._stop.is_set():
                with conn.transaction():  # one snapshot for the horizon, the rows and the places
                    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                    next_horizon = str(conn.execute(self._horizon).fetchone()[0])  # type: ignore[index]
                    rows = conn.execute(self._rows, (horizon,)).fetchall()
                    tracked = conn.execute(self._tracked).fetchone() or ()
                if last_poll is None:  # the rows before the run: not measured
                    seen.update(int(position) for _, position in rows)
                    rows = []
                horizon = next_horizon
                now = time.monotonic()
                if last_poll is not None:
                    self.intervals.append(now - last_poll)
                last_poll = now
                for xact, position in rows:
                    if int(position) not in seen:
                        seen.add(int(position))
                        self._pending.append(((int(xact), int(position)), now))
                        self._unreadable.append(((int(xact), int(position)), now))
                below = int(horizon)
                self.horizon_lags += [now - first for p, first in self._unreadable if p[0] < below]
                self._unreadable = [(p, first) for p, first in self._unreadable if p[0] >= below]
                places = [(int(t[0]), int(t[1])) if t else (0, 0) for t in tracked]
                least = min(places) if places else (0, 0)
                keep = []
                for place, first in self._pending:
                    if place <= least:
                        self.lags.append(now - first)
                    else:
                        keep.append((place, first))
                self._pending = keep
                self.caught_up = not keep
                time.sleep(self._sleep)


def figure_7(db: Database, cfg: Config) -> Figure:
    turns = cfg.pick(*SESSION_TURNS)
    p50s, p99s, rates, intervals, counts = [], [], [], [], []
    horizon_p99s = []
    with scratch_namespace(db) as settings:
        # The read models' tables exist before the runner and the sampler start.
        reader = build_process(settings, None).start()
        runner = Process(settings, "projections", "projections", "run")
        try:
            status = reader.reads()
            poll(lambda: all(s["running"] for s in status.status()), 60, "projections running")
            reader.stop()
            pool = WriterPool(db)
            for _ in range(cfg.repeat):
                sampler = LagSampler(db, settings.schema_name)
                sampler.start()
                rates.append(pool.rate("turnlog", settings.namespace, turns))
                poll(lambda s=sampler: s.caught_up, 60, "projections caught up")
                time.sleep(0.05)
                sampler.stop()
                lags_ms = [lag * 1000 for lag in sampler.lags]
                p50s.append(percentile(lags_ms, 50))
                p99s.append(percentile(lags_ms, 99))
                intervals.append(percentile([i * 1000 for i in sampler.intervals], 50))
                counts.append(len(lags_ms))
                horizon_p99s.append(percentile([lag * 1000 for lag in sampler.horizon_lags], 99))
            pool.close()
        finally:
            runner.kill()
            reader.stop()
    p99 = Stat(p99s, "ms")
    return Figure(
        7,
        "live projection lag (commit → read-model row) under figure 2's load",
        [
            Row("7", "lag p50, ms", Stat(p50s, "ms"), None, None, "—", None),
            Row("7b", "lag p99, ms", p99, None, None, "p99 ≤ 100 ms", p99.median <= 100),
            Row(
                "7c",
                "commit → below the commit horizon (readable by any log reader), p99, ms",
                Stat(horizon_p99s, "ms"),
                None,
                None,
                "—",
                None,
            ),
        ],
        how=(
            "A real `turnlog projections run` process (all three read models) follows the log"
            f" while {PROCESSES} processes run {turns} turns each as in figure 2. A sampler"
            " thread polls, about every millisecond on its own connection, one snapshot of the"
            " log's new rows and the lowest tracking place (transaction id, position) of the"
            " three read models: an event counts as committed at the first poll that sees it"
            " and as projected at the first poll where every read model has tracked its place"
            " (rows and tracking commit together). Row 7c: from the first poll that sees an"
            " event to the first whose commit horizon is past its transaction, when every log"
            " reader (read models, followers, `?min_position`) can read it."
            " Each poll reads only the rows of transactions at or above the previous poll's"
            " horizon (the log-order index). Lag is per event; p50 and p99 per run, median"
            " over runs. Resolution is one poll"
            f" (median poll interval {', '.join(f'{i:.1f}' for i in intervals)} ms); no"
            " baseline."
        ),
        details={
            "events_sampled": counts,
            "turns_per_second_during_runs": rates,
            "poll_interval_ms_p50": intervals,
        },
    )
