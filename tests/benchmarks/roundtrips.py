"""Round trips and commits per turn, counted in the client.

    .venv/bin/python -m tests.benchmarks.roundtrips [TURNS]          # figure 1's path
    .venv/bin/python -m tests.benchmarks.roundtrips --http [TURNS] [--clients N]

The first drives turns through the application API in this process; the
second runs the HTTP app with every role (API, worker, projection runners) in
this process on a loopback port and submits each turn with ``?wait``, so the
counts include the read models' writes and the server's reads. ``--json``
prints one object (figure 12 of ``make bench`` reads it).

Each is measured as a cycle: build the runtime (or start the server), run
the turns, close every connection; the same cycle without turns is measured
too and taken off, so start-up and shutdown do not count, while what runs
in the background during the turns (polls, heartbeats) does. The server's
side, exact only when nothing else uses the server:

- transactions given an id (``pg_current_snapshot``'s xmax before and after):
  every transaction that wrote, and every NOTIFY's. Less the NOTIFYs counted
  in the client, these are the durable commits (a NOTIFY flushes nothing);
- committed transactions, reads included (``xact_commit`` of
  ``pg_stat_database``, read once every backend of the cycle has exited and
  reported).

Round trips are counted as psycopg waits on the socket: in pipeline mode (the
read models' batches) each send counts too, so there the count is an upper
bound. A round trip is one request/response exchange with the server, as psycopg
waits for it (``Connection.wait`` on an operation that touches the socket: a
statement, a commit, a COPY …; a commit with no transaction open is none), counted
for every connection of the process (pools, leases, the notifier). Commits
are counted where they happen: saves (one autocommit insert each: a durable
commit), notifications (a ``NOTIFY`` after commits: no disk flush; sent in
the save's own round trip or coalesced on the notifier's thread), and other
transactions opened by the code (``conn.transaction`` blocks that commit).
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from tests.benchmarks import bench_turns
from tests.benchmarks.bench_throughput import Config
from tests.benchmarks.suite import (
    ROOT,
    Figure,
    Row,
    Stat,
    bench_database,
    run_together,
    scratch_namespace,
)
from turnlog.application.store import said_turns, session_log
from turnlog.application.store.lost_commits import RIDES
from turnlog.application.store.recorder import Notifier, TurnlogRecorder
from turnlog.application.store.seal import SnapshotRecorder

counts: Counter[str] = Counter()
_lock = threading.Lock()


def _count(key: str) -> None:
    with _lock:
        counts[key] += 1


def install() -> None:
    wait = psycopg.Connection.wait
    insert = TurnlogRecorder.insert_events
    snapshot = SnapshotRecorder.insert_events
    write_said = said_turns.write
    prune = session_log.prune
    send = Notifier._send
    take_now = Notifier.take_now
    exit_ = psycopg.Transaction.__exit__

    def counted_wait(self: Any, gen: Any, *args: Any, **kwargs: Any) -> Any:
        def counting() -> Any:  # an exchange with the server: the generator waits on the socket
            value, exchanged = None, False
            try:
                while True:
                    request = gen.send(value)
                    if not exchanged:
                        _count("round trips")
                        exchanged = True
                    value = yield request
            except StopIteration as stop:
                return stop.value

        return wait(self, counting(), *args, **kwargs)

    def counted_insert(self: Any, *args: Any, **kwargs: Any) -> Any:
        _count(RIDING if kwargs.get(RIDES) else "saves (durable commits)")
        return insert(self, *args, **kwargs)

    def counted_snapshot(self: Any, *args: Any, **kwargs: Any) -> Any:
        _count(CACHES)
        return snapshot(self, *args, **kwargs)

    def counted_said(*args: Any) -> int:
        written = write_said(*args)
        if written:
            _count(CACHES)
        return written

    def counted_prune(*args: Any) -> int:
        _count(CACHES)
        return prune(*args)

    def counted_send(self: Any, *args: Any) -> None:
        _count("notifications (NOTIFY commits, no flush)")
        send(self, *args)

    def counted_take_now(self: Any, *args: Any) -> Any:
        taken = take_now(self, *args)
        if taken is not None:  # sent in the save's own round trip
            _count("notifications (NOTIFY commits, no flush)")
        return taken

    def counted_exit(self: Any, exc_type: Any, *args: Any) -> Any:
        if exc_type is None and not getattr(self, "force_rollback", False):
            _count("other committed transactions")
        return exit_(self, exc_type, *args)

    psycopg.Connection.wait = counted_wait  # type: ignore[method-assign]
    TurnlogRecorder.insert_events = counted_insert  # type: ignore[method-assign]
    SnapshotRecorder.insert_events = counted_snapshot  # type: ignore[method-assign]
    said_turns.write = counted_said
    session_log.prune = counted_prune
    Notifier._send = counted_send  # type: ignore[method-assign]
    Notifier.take_now = counted_take_now  # type: ignore[method-assign]
    psycopg.Transaction.__exit__ = counted_exit  # type: ignore[method-assign]


@dataclass
class Cycle:
    """What one cycle (build, maybe run turns, close everything) cost."""

    counted: Counter[str]  # in this process's client code (see ``install``)
    xids: int  # transaction ids the server gave out: every write, every NOTIFY
    commits: int  # the server's count of committed transactions, read ones too
    cpu_ms: float  # this process's CPU
    wal_syncs: int = 0  # the server's WAL flushes to disk (fsync or its like)

    def per_turn(
        self, empty: Cycle, turns: int, left_out: Counter[str] | None = None
    ) -> dict[str, float]:
        """This cycle less ``empty`` (the same cycle without turns) and ``left_out``, per turn.

        ``left_out``: what the measurement itself did during this cycle.
        """
        left_out = left_out or Counter()
        keys = set(self.counted) | set(empty.counted)
        out = {k: (self.counted[k] - empty.counted[k] - left_out[k]) / turns for k in sorted(keys)}
        out[SERVER_WRITES] = (self.xids - empty.xids) / turns
        # A NOTIFY's transaction takes an id but writes nothing to flush; a riding save's
        # commit does not wait for the disk, nor does a snapshot's or a said row's.
        riding = out.get(RIDING, 0.0) + out.get(CACHES, 0.0)
        out[DURABLE] = out[SERVER_WRITES] - out.get(NOTIFICATIONS, 0.0) - riding
        out[WAL_SYNCS] = (self.wal_syncs - empty.wal_syncs) / turns
        out[SERVER_COMMITS] = (self.commits - empty.commits - left_out[SERVER_COMMITS]) / turns
        out[CPU] = (self.cpu_ms - empty.cpu_ms) / turns
        return out


NOTIFICATIONS = "notifications (NOTIFY commits, no flush)"
RIDING = "saves riding (commit not waiting for the disk)"
CACHES = "snapshots, their pruning and said rows (commits not waiting for the disk)"
WAL_SYNCS = "server: WAL flushes to disk (fsyncs)"
SERVER_WRITES = "server: transactions given an id (writes and NOTIFYs)"
DURABLE = "durable commits (server's writes less the NOTIFYs and riding commits)"
SERVER_COMMITS = "server: committed transactions (reads too)"
CPU = "process CPU, ms"


OWN = 2  # transactions of one read of server_counts: its connection's start, its statement


# The server's WAL flushes so far: pg_stat_wal until PostgreSQL 17, pg_stat_io from 18.
_WAL_SYNCS = (
    "SELECT CASE WHEN current_setting('server_version_num')::int < 180000"
    " THEN (SELECT (to_jsonb(w) ->> 'wal_sync')::bigint FROM pg_stat_wal w)"
    " ELSE (SELECT (sum((to_jsonb(i) ->> 'fsyncs')::bigint))::bigint FROM pg_stat_io i"
    "  WHERE i.object = 'wal') END"
)


def wal_syncs(db: Any) -> int:
    """The server's WAL flushes to disk since its statistics were reset."""
    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        row = conn.execute("SELECT pg_stat_clear_snapshot(), (" + _WAL_SYNCS + ")").fetchone()
    return int(row[1] or 0) if row else 0


def server_counts(db: Any) -> tuple[int, int]:
    """(transaction ids given out, committed transactions) of the server, once settled.

    Ids are exact at once. A backend reports its committed transactions at
    most once a second and when it exits: called after every connection of
    the cycle closed, this reads until two reads agree: apart by a read's own
    two transactions (its connection's start and its statement), counted
    alike in every cycle.
    """
    deadline = time.monotonic() + 30
    last: int | None = None
    while True:
        with psycopg.connect(db.conninfo, autocommit=True) as conn:
            row = conn.execute(
                "SELECT pg_stat_clear_snapshot(),"
                " pg_snapshot_xmax(pg_current_snapshot())::text::bigint,"
                " (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database())"
            ).fetchone()
        assert row is not None
        xids, commits = int(row[1]), int(row[2])
        if last is not None and commits - last <= OWN:
            return xids, commits
        if time.monotonic() > deadline:
            print(
                f"server_counts: not settled after 30 s (+{commits - (last or 0)})", file=sys.stderr
            )
            return xids, commits
        last = commits
        time.sleep(0.5)  # statistics arrive when backends exit: nothing to wait on but time


def cycle(db: Any, run: Callable[[], None]) -> Cycle:
    before, (xids, commits) = Counter(counts), server_counts(db)
    syncs = wal_syncs(db)
    cpu = time.process_time()
    run()
    cpu_ms = (time.process_time() - cpu) * 1000
    after_xids, after_commits = server_counts(db)
    return Cycle(
        Counter(counts) - before,
        after_xids - xids,
        after_commits - commits,
        cpu_ms,
        wal_syncs(db) - syncs,
    )


def in_process(turns: int) -> tuple[dict[str, float], str]:
    from turnlog.interface.bootstrap import build_runtime

    db = bench_database()
    with scratch_namespace(db, "rt") as settings:
        settings = bench_turns.bench_settings(db, settings.namespace)
        rt = build_runtime(settings)
        try:
            session_id = rt.sessions.create_session(tools=["echo"]).session_id
            bench_turns.run_turn(rt, session_id)  # warm-up: the namespace is ready
        finally:
            rt.close()

        def run(n: int) -> Callable[[], None]:
            def go() -> None:
                runtime = build_runtime(settings)
                try:
                    for _ in range(n):
                        bench_turns.run_turn(runtime, session_id)
                finally:
                    runtime.close()

            return go

        empty = cycle(db, run(0))
        full = cycle(db, run(turns))
    return full.per_turn(empty, turns), "figure 1's path"


def over_http(turns: int, clients: int) -> tuple[dict[str, float], str]:
    import uvicorn

    from tests.benchmarks.bench_http import HttpClient
    from tests.deadlines import poll
    from turnlog.interface.http import create_app

    db = bench_database()
    with scratch_namespace(db, "rth") as namespace:
        settings = bench_turns.bench_settings(db, namespace.namespace)
        sessions: list[str] = []
        own: Counter[str] = Counter()  # the measurement's own statements, left out

        def serve(total: int) -> None:
            """A server with every role in this process; ``total`` turns; stopped."""
            app = create_app(settings, role="all", worker_concurrency=max(4, clients))
            server = uvicorn.Server(
                uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None, lifespan="on")
            )
            thread = threading.Thread(target=server.run, daemon=True)
            thread.start()
            try:
                poll(lambda: server.started, 60, "the server")
                port = server.servers[0].sockets[0].getsockname()[1]
                process = app.state.turnlog.process
                url = f"http://127.0.0.1:{port}"
                if not sessions:  # one per client, made (and warmed) in the first cycle
                    sessions.extend(HttpClient(url).session_id for _ in range(clients))

                def client(sid: str, count: int) -> None:
                    http = HttpClient(url, session_id=sid)
                    try:
                        for _ in range(count):
                            http.turn(bench_turns.TOOL_MESSAGE)
                    finally:
                        http.close()

                def settle() -> None:
                    # The worker let go, and every runner is at the log's head (read
                    # here once, and left out).
                    poll(lambda: process.worker.held == 0, 30, "the worker to let go")
                    mark = Counter(counts)
                    head = process.read_models.events.head()
                    own.update(Counter(counts) - mark)
                    own[SERVER_COMMITS] += 1
                    poll(
                        lambda: all(r["position"] >= head for r in process.supervisor.runners()),
                        30,
                        "the read models",
                    )

                if clients == 1:
                    for _ in range(total):  # one at a time, each turn settled
                        client(sessions[0], 1)
                        settle()
                elif total:
                    shares = [total // clients + (i < total % clients) for i in range(clients)]
                    # A turn not completed fails the count (raised once every client ended).
                    run_together(
                        [
                            functools.partial(client, sid, n)
                            for sid, n in zip(sessions, shares, strict=True)
                        ]
                    )
                    settle()
            finally:
                server.should_exit = True
                thread.join(60)

        serve(clients)  # warm-up: the namespace, the sessions, one turn each
        empty = cycle(db, lambda: serve(0))
        own.clear()
        full = cycle(db, lambda: serve(turns))
        result = full.per_turn(empty, turns, left_out=own)
    each = "each settled" if clients == 1 else f"from {clients} clients at once"
    return result, f"a turn through serve --role all (?wait; {each})"


# ------------------------------------------------------------------ figure 12


def measured(*args: str) -> dict[str, float]:
    """One count in a process of its own (``install`` patches psycopg for the whole process)."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.benchmarks.roundtrips", "--json", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"roundtrips {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    per_turn: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])["per_turn"]
    return per_turn


def figure_12(db: Any, cfg: Config) -> Figure:
    solo, many, clients = cfg.pick(60, 10), cfg.pick(320, 32), 16
    app = measured(str(solo))
    one = measured("--http", str(solo))
    crowd = measured("--http", str(many), "--clients", str(clients))

    def row(number: str, what: str, http: dict[str, float], key: str, unit: str) -> Row:
        limit = 8 if key == DURABLE else None  # the durable commits' target; the rest: report
        return Row(
            number,
            what,
            Stat([round(http[key], 2)], unit),
            Stat([round(app[key], 2)], unit),
            http[key] / app[key],
            "report" if limit is None else f"≤ {limit} {unit}",
            None if limit is None else http[key] <= limit,
        )

    crowded = f"{clients} clients"
    rows = [
        row(
            "12a",
            "durable commits per turn through HTTP, 1 client (saves + read models)",
            one,
            DURABLE,
            "commits",
        ),
        row("12b", f"durable commits per turn through HTTP, {crowded}", crowd, DURABLE, "commits"),
        row(
            "12c",
            "committed transactions per turn through HTTP, 1 client (the server's count)",
            one,
            SERVER_COMMITS,
            "transactions",
        ),
        row(
            "12d",
            f"committed transactions per turn through HTTP, {crowded}",
            crowd,
            SERVER_COMMITS,
            "transactions",
        ),
    ]
    rows += [
        Row(
            "12e",
            "committed transactions per in-process turn (figure 1's path, reads included)",
            Stat([round(app[SERVER_COMMITS], 2)], "transactions"),
            None,
            None,
            "≤ 8 transactions",
            app[SERVER_COMMITS] <= 8,
        ),
        Row(
            "12f",
            "commits that wait for the disk per in-process turn, and the rest ride",
            Stat([round(app[DURABLE], 2)], "commits"),
            Stat([round(app.get(RIDING, 0.0), 2)], "riding"),
            None,
            "report",
            None,
        ),
        Row(
            "12g",
            "WAL flushes per in-process turn (the server's fsyncs)",
            Stat([round(app[WAL_SYNCS], 2)], "fsyncs"),
            None,
            None,
            "report",
            None,
        ),
    ]
    return Figure(
        12,
        "commits and transactions per turn through HTTP",
        rows,
        how=(
            "Counts, not timings, each in a process of its own"
            " (`python -m tests.benchmarks.roundtrips`). HTTP: every role (API, worker,"
            " read models) in one process, as `serve --role all`; turns submitted with"
            f" `?wait` by 1 client ({solo} turns, each settled: the worker let go and the read"
            f" models at the log's head before the next) and by {clients} clients at once"
            f" ({many} turns). Baseline: {solo} turns of figure 1's path (the application"
            " API in one process, no read models). Each count is a cycle less the same cycle"
            " without turns (start-up and shutdown left out; polls and heartbeats during the"
            " turns kept). Durable commits: the transactions the server gave an id"
            " (`pg_current_snapshot`'s xmax before and after) less the NOTIFYs, which take"
            " an id but flush nothing. Committed transactions: the server's `xact_commit`,"
            " reads included, read once every backend of the cycle exited. Rows 12e-g: the"
            " baseline's own counts per turn: committed transactions; saves whose commit"
            " waits for the disk, and saves that ride (docs/durability.md); the server's WAL"
            " flushes (`pg_stat_wal.wal_sync`, `pg_stat_io` from PostgreSQL 18)."
        ),
        details={"per_turn": {"app": app, "http_1_client": one, f"http_{clients}_clients": crowd}},
    )


def main(http: bool, turns: int, clients: int = 1, as_json: bool = False) -> None:
    install()
    per_turn, path = over_http(turns, clients) if http else in_process(turns)
    if as_json:
        print(json.dumps({"path": path, "turns": turns, "per_turn": per_turn}))
        return
    print(f"per turn, over {turns} turns of {path}:")
    for key in sorted(per_turn):
        print(f"  {key}: {per_turn[key]:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("turns", type=int, nargs="?", default=50)
    parser.add_argument("--http", action="store_true", help="through serve --role all")
    parser.add_argument("--clients", type=int, default=1, help="HTTP clients at once")
    parser.add_argument("--json", action="store_true", help="one JSON object (for make bench)")
    args = parser.parse_args()
    main(args.http, args.turns, args.clients, args.json)
