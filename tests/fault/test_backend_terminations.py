"""Every PostgreSQL backend of a serving process terminated, round after round, under load.

A ``serve`` process (API, worker and projection runners in one) is read by
four clients and written by one, each write under an ``Idempotency-Key``.
Several times, every connection of that process is terminated server-side at
once (``pg_terminate_backend``: its pool, its leases, its LISTEN, its runners'
lock connections). The server stays up all along, so no client may hear 503:
an idle pooled connection that died is replaced before it is lent, and a
read or a keyed write whose connection dies in flight runs once more.
Only the test's own namespace's processes are touched, so it runs on any
server (``make test``).
"""

from __future__ import annotations

import collections
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from tests.api.conftest import FAST, live_server
from tests.fault.cluster import Cluster, Process, cluster, poll
from tests.fault.proxy import Proxy
from tests.fault.test_database_faults import backends
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database
from turnlog.interface.http import create_app

pytestmark = pytest.mark.fault

ROUNDS = int(os.environ.get("TERMINATION_ROUNDS", "8"))
# Answers between two rounds of terminations, by all clients together.
REQUESTS_PER_ROUND = int(os.environ.get("TERMINATION_ROUND_REQUESTS", "60"))


@pytest.fixture
def serving(settings: Settings, database: Database) -> Iterator[tuple[Cluster, Process]]:
    with cluster(settings, database) as c:
        yield c, c.api("all", PGAPPNAME=f"tl-{settings.namespace}-serve")


def serve_backends(c: Cluster, process: Process) -> list[int]:
    """Every connection of the serving process: tagged ones, and those it names itself."""
    return backends(
        c,
        f"tl-{c.settings.namespace}-serve",
        f"turnlog-% {socket.gethostname()[:24]}:{process.pid}",  # LISTEN, the runners' locks
        f"turnlog-catch-up {c.settings.namespace}"[:63],
    )


def terminate_at_once(c: Cluster, pids: list[int]) -> None:
    """Terminate the backends in one statement: none has died before the others are signalled."""
    with psycopg.connect(c.database.conninfo, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,))


class Load:
    """Four readers and one keyed writer, counting every answer by its status."""

    def __init__(self, c: Cluster, session_id: str) -> None:
        self.c = c
        self.session_id = session_id
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.statuses: collections.Counter[int] = collections.Counter()
        self.failures: list[str] = []
        self.answered = 0
        self.threads = [threading.Thread(target=self._read, args=(i,)) for i in range(4)]
        self.threads.append(threading.Thread(target=self._write))

    def _count(self, method: str, path: str, response: httpx.Response) -> None:
        with self.lock:
            self.statuses[response.status_code] += 1
            self.answered += 1
            if response.status_code >= 500:
                self.failures.append(f"{method} {path}: {response.status_code} {response.text}")

    def _read(self, index: int) -> None:
        paths = [
            "/v1/sessions",
            f"/v1/sessions/{self.session_id}",
            f"/v1/sessions/{self.session_id}/events",
            "/v1/open-turns",
            "/v1/tool-calls",
            f"/v1/sessions/{self.session_id}/turns",
        ]
        i = index
        while not self.stop.is_set():
            path = paths[i % len(paths)]
            i += 1
            self._count("GET", path, self.c.request("GET", path))

    def _write(self) -> None:
        while not self.stop.is_set():
            key = uuid.uuid4().hex
            created = self.c.request(
                "POST", "/v1/sessions", json={"title": "load"}, headers={"Idempotency-Key": key}
            )
            self._count("POST", "/v1/sessions", created)
            if created.status_code != 201:
                continue
            path = f"/v1/sessions/{created.json()['session_id']}/turns"
            turn = self.c.request(
                "POST", path, json={"message": "hello"}, headers={"Idempotency-Key": f"{key}-t"}
            )
            self._count("POST", path, turn)

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()

    def more(self, count: int) -> int:
        """Wait (polling) until ``count`` more requests were answered."""
        target = self.answered + count
        poll(lambda: self.answered >= target, 60, f"{count} more answers")
        return self.answered


def test_terminating_every_backend_of_serve_under_load_never_answers_503(
    serving: tuple[Cluster, Process],
) -> None:
    c, process = serving
    session_id = c.new_session()
    assert c.submit(session_id, "warm up", wait=30).status_code == 200  # every pool is open
    terminated = 0
    with Load(c, session_id) as load:
        load.more(REQUESTS_PER_ROUND)
        for _ in range(ROUNDS):
            pids = serve_backends(c, process)
            assert pids, "no connections found for the serving process"
            terminate_at_once(c, pids)
            terminated += len(pids)
            load.more(REQUESTS_PER_ROUND)
    assert process.proc.poll() is None, "the serving process died"
    counts = f"{terminated} backends terminated, {load.answered} answers: {dict(load.statuses)}"
    print(counts)
    assert load.statuses[503] == 0 and not load.failures, (counts, load.failures[:10])
    # Still serving: a turn completes after the last round.
    done = c.submit(session_id, "after", wait=30)
    assert done.status_code == 200 and done.json()["state"] == "completed", done.text


def test_a_retry_is_not_lent_a_sibling_that_died_with_the_first_connection(
    settings: Settings, database: Database
) -> None:
    """Every pooled connection dies at once and none shows it before use: the retry pings.

    The proxy cuts each connection open through it at its next use, as a
    backend that was told to end but has not yet said so. The first attempt
    of a read fails on one; the second must not be lent another of them.
    """
    proxy = Proxy(database.params)
    proxy.up()
    through = {**database.params, "host": "127.0.0.1", "port": proxy.port}
    app = create_app(
        settings.model_copy(update={"database_url": make_conninfo(**through)}),
        role="api",
        options=FAST,
    )
    try:
        with live_server(app) as url:
            for _ in range(3):  # the pool's idle connections, each used once
                assert httpx.get(f"{url}/v1/sessions", timeout=30).status_code == 200
            proxy.sever()
            answers = [httpx.get(f"{url}/v1/sessions", timeout=60) for _ in range(3)]
            created = httpx.post(
                f"{url}/v1/sessions", json={}, headers={"Idempotency-Key": "k1"}, timeout=60
            )
    finally:
        proxy.down()
    assert [a.status_code for a in answers] == [200, 200, 200], [a.text for a in answers]
    assert created.status_code == 201, created.text
