"""Round trips and commits per turn, counted in the client.

    .venv/bin/python -m tests.benchmarks.roundtrips [TURNS]          # figure 1's path
    .venv/bin/python -m tests.benchmarks.roundtrips --http [TURNS] [--clients N]

The first drives turns through the application API in this process; the
second runs the HTTP app with every role (API, worker, projection runners) in
this process on a loopback port and submits each turn with ``?wait``, so the
counts include the read models' writes and the server's reads. Both also
report the server's own count of committed transactions (``xact_commit`` of
``pg_stat_database``; exact only when nothing else uses the database).

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
import threading
import time
from collections import Counter
from typing import Any

import psycopg

from tests.benchmarks import bench_turns
from tests.benchmarks.suite import bench_database, scratch_namespace
from turnlog.application.recorder import Notifier, TurnlogRecorder

counts: Counter[str] = Counter()
_lock = threading.Lock()


def _count(key: str) -> None:
    with _lock:
        counts[key] += 1


def install() -> None:
    wait = psycopg.Connection.wait
    insert = TurnlogRecorder.insert_events
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
        _count("saves (durable commits)")
        return insert(self, *args, **kwargs)

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
    Notifier._send = counted_send  # type: ignore[method-assign]
    Notifier.take_now = counted_take_now  # type: ignore[method-assign]
    psycopg.Transaction.__exit__ = counted_exit  # type: ignore[method-assign]


def server_commits(db: Any) -> int:
    """The server's count of committed transactions in this database (this query's too)."""
    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


def in_process(turns: int) -> tuple[Counter[str], str]:
    from turnlog.interface.bootstrap import build_runtime

    db = bench_database()
    with scratch_namespace(db, "rt") as settings:
        rt = build_runtime(bench_turns.bench_settings(db, settings.namespace))
        try:
            session_id = rt.sessions.create_session(tools=["echo"]).session_id
            bench_turns.run_turn(rt, session_id)  # warm-up
            before, xacts = Counter(counts), server_commits(db)
            cpu = time.process_time()
            for _ in range(turns):
                bench_turns.run_turn(rt, session_id)
            after_cpu = round((time.process_time() - cpu) * 1000)
            rt.sessions.recorder.notifier.close()  # type: ignore[attr-defined]
            after = Counter(counts)
            after["server: committed transactions"] = server_commits(db) - xacts - 1
            after["process CPU, ms"] = after_cpu
        finally:
            rt.close()
    return after - before, "figure 1's path"


def over_http(turns: int, clients: int) -> tuple[Counter[str], str]:
    import httpx
    import uvicorn

    from tests.deadlines import poll
    from turnlog.interface.http import create_app

    db = bench_database()
    with scratch_namespace(db, "rth") as settings:
        app = create_app(
            bench_turns.bench_settings(db, settings.namespace),
            role="all",
            worker_concurrency=max(4, clients),
        )
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
            own: Counter[str] = Counter()  # the measurement's own statements, left out

            # One session per client, made before the counting starts: what is
            # counted is turns (as in-process, where the session exists already).
            sessions: list[str] = []
            with httpx.Client(base_url=url, timeout=120) as http:
                for _ in range(clients):
                    made = http.post("/v1/sessions", json={"tools": ["echo"]}).json()
                    sessions.append(made["session_id"])

            def client(sid: str, count: int) -> None:
                with httpx.Client(base_url=url, timeout=120) as http:
                    for _ in range(count):
                        answer = http.post(
                            f"/v1/sessions/{sid}/turns",
                            params={"wait": 60},
                            json={"message": bench_turns.TOOL_MESSAGE},
                        )
                        body = answer.json()
                        assert answer.status_code == 200, body
                        assert body["state"] == "completed", body

            def settle() -> None:
                # The worker let go, and every runner is at the log's head (read
                # here once, and left out).
                poll(lambda: process.worker.held == 0, 30, "the worker to let go")
                mark = Counter(counts)
                head = process.read_models.events.head()
                own.update(Counter(counts) - mark)
                own["server: committed transactions"] += 1
                poll(
                    lambda: all(r["position"] >= head for r in process.supervisor.runners()),
                    30,
                    "the read models",
                )

            def run(total: int) -> None:
                shares = [total // clients + (i < total % clients) for i in range(clients)]
                if clients == 1:
                    for _ in range(total):  # one at a time, each turn settled
                        client(sessions[0], 1)
                        settle()
                    return
                threads = [
                    threading.Thread(target=client, args=(sid, n))
                    for sid, n in zip(sessions, shares, strict=True)
                ]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                settle()

            run(clients)  # warm-up
            before, xacts = Counter(counts), server_commits(db)
            own.clear()
            cpu = time.process_time()
            run(turns)
            after = Counter(counts)
            after["process CPU, ms (server and client threads)"] = round(
                (time.process_time() - cpu) * 1000
            )
            after["server: committed transactions"] = server_commits(db) - xacts - 1
            after.subtract(own)
        finally:
            server.should_exit = True
            thread.join(30)
    each = "each settled" if clients == 1 else f"from {clients} clients at once"
    return after - before, f"a turn through serve --role all (?wait; {each})"


def main(http: bool, turns: int, clients: int = 1) -> None:
    install()
    counted, path = over_http(turns, clients) if http else in_process(turns)
    print(f"per turn, over {turns} turns of {path}:")
    for key in sorted(counted):
        print(f"  {key}: {counted[key] / turns:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("turns", type=int, nargs="?", default=50)
    parser.add_argument("--http", action="store_true", help="through serve --role all")
    parser.add_argument("--clients", type=int, default=1, help="HTTP clients at once")
    args = parser.parse_args()
    main(args.http, args.turns, args.clients)
