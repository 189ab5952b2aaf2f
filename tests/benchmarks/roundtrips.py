"""Round trips and commits per turn on figure 1's path, counted in the client.

    .venv/bin/python tests/benchmarks/roundtrips.py [TURNS]

A round trip is one request/response exchange with the server, as psycopg
waits for it (``Connection.wait`` on an operation that touches the socket: a
statement, a commit, a COPY …; a commit with no transaction open is none), counted
for every connection of the process (pools, leases, the notifier). Commits
are counted where they happen: saves (one autocommit insert each: a durable
commit), notifications (a ``NOTIFY`` after commits: no disk flush, and
coalesced), and other transactions opened by the code (``conn.transaction``
blocks that commit).
"""

from __future__ import annotations

import sys
import threading
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

    def counted_send(self: Any) -> None:
        _count("notifications (NOTIFY commits, no flush)")
        send(self)

    def counted_exit(self: Any, exc_type: Any, *args: Any) -> Any:
        if exc_type is None and not getattr(self, "force_rollback", False):
            _count("other committed transactions")
        return exit_(self, exc_type, *args)

    psycopg.Connection.wait = counted_wait  # type: ignore[method-assign]
    TurnlogRecorder.insert_events = counted_insert  # type: ignore[method-assign]
    Notifier._send = counted_send  # type: ignore[method-assign]
    psycopg.Transaction.__exit__ = counted_exit  # type: ignore[method-assign]


def main(turns: int) -> None:
    from turnlog.interface.bootstrap import build_runtime

    install()
    db = bench_database()
    with scratch_namespace(db, "rt") as settings:
        rt = build_runtime(bench_turns.bench_settings(db, settings.namespace))
        try:
            session_id = rt.sessions.create_session(tools=["echo"]).session_id
            bench_turns.run_turn(rt, session_id)  # warm-up
            before = Counter(counts)
            for _ in range(turns):
                bench_turns.run_turn(rt, session_id)
            rt.sessions.recorder.notifier.close()  # type: ignore[attr-defined]
            after = Counter(counts)
        finally:
            rt.close()
    print(f"per turn, over {turns} turns of figure 1's path:")
    for key in sorted(after):
        print(f"  {key}: {(after[key] - before[key]) / turns:.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 50)
