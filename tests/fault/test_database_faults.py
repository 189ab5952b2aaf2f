"""Database faults: connections killed server-side, and PostgreSQL itself restarted.

Killing a component's connections (``pg_terminate_backend``) touches only the
processes of the test's namespace, so it runs in ``make test`` on any server.
Restarting the server is different: it would break every other test using
it, so those tests run only under ``make chaos`` (``TURNLOG_CHAOS=1``) and
only against the machine's own server at 127.0.0.1:5432 (the URL in
``TURNLOG_TEST_DATABASE_URL``); anywhere else they are skipped, saying why.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.api.conftest import FAST, caught_up, live_server
from tests.deadlines import scaled
from tests.fault.campaign import Workload
from tests.fault.cluster import Cluster, Process, cluster, poll, shared_namespace
from tests.fault.proxy import Proxy
from tests.fault.record import Record, check, final_state
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database
from turnlog.interface.http import create_app

pytestmark = pytest.mark.fault


def backends(c: Cluster, *patterns: str) -> list[int]:
    """Server pids of the connections whose application_name matches a LIKE pattern."""
    with psycopg.connect(c.database.conninfo, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name LIKE ANY(%s)"
            " AND pid <> pg_backend_pid()",
            (list(patterns),),
        ).fetchall()
    return [int(r[0]) for r in rows]


def terminate(c: Cluster, pids: list[int]) -> None:
    with psycopg.connect(c.database.conninfo, autocommit=True) as conn:
        for pid in pids:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


@pytest.fixture(scope="module")
def tagged(
    database: Database, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Cluster, dict[str, Process]]]:
    """An API, a projection runner and a worker whose connections carry their role's name.

    Shared by the three tests: each kills one component's connections, and the next
    one starts from a cluster that has just survived that.
    """
    with (
        shared_namespace(database, tmp_path_factory.mktemp("tagged")) as settings,
        cluster(settings, database) as c,
    ):
        tag = f"tl-{settings.namespace}"
        procs = {
            "api": c.api("api", PGAPPNAME=f"{tag}-api"),
            "projections": c.projections(PGAPPNAME=f"{tag}-projections"),
            "worker": c.worker("w1", PGAPPNAME=f"{tag}-worker"),
        }
        yield c, procs


def component_backends(c: Cluster, component: str, process: Process) -> list[int]:
    patterns = [f"tl-{c.settings.namespace}-{component}"]
    if component == "projections":
        patterns.append(f"turnlog-projection %:{process.pid}")  # the runners' lock connections
    return backends(c, *patterns)


@pytest.mark.parametrize("component", ["api", "worker", "projections"])
def test_every_connection_of_a_component_killed_server_side_is_survived(
    tagged: tuple[Cluster, dict[str, Process]], component: str
) -> None:
    c, procs = tagged
    session_id = c.new_session()
    assert c.submit(session_id, "warm up", wait=30).status_code == 200  # every pool is open
    in_flight = c.submit(session_id, '/tool sleep {"seconds": 1}').json()["turn_id"]
    poll(lambda: "ToolCallStarted" in c.topics(session_id), 20, "the call started")
    pids = component_backends(c, component, procs[component])
    assert pids, f"no connections found for {component}"
    terminate(c, pids)

    # Reads of every kind first, on whatever connections the pools still hold.
    statuses = [
        c.request("GET", path).status_code
        for path in ("/v1/sessions", "/v1/open-turns", "/v1/tool-calls", "/v1/projections")
    ]

    def turn_state() -> str | None:
        response = c.request("GET", f"/v1/sessions/{session_id}/turns/{in_flight}")
        statuses.append(response.status_code)
        return response.json().get("state") if response.status_code == 200 else None

    poll(lambda: turn_state() == "completed", 30, "the turn in flight completing")
    for i in range(3):
        done = c.submit(session_id, f"after {i}", wait=30)
        statuses.append(done.status_code)
        assert done.status_code == 200, done.text
        # A read model restarting after its connections were killed may lag meanwhile.
        at = {"min_position": done.json()["position"]}
        listed = caught_up(functools.partial(c.request, "GET", "/v1/sessions", params=at))
        statuses.append(listed.status_code)
    assert all(p.proc.poll() is None for p in procs.values()), "a process died"
    assert not [s for s in statuses if s >= 500], statuses  # no client saw the fault
    record = Record(c.settings, c.database)
    try:
        findings = check(record.refresh(), [in_flight])
        assert findings.ok, findings
        assert final_state(record.by_turn()[in_flight]) == "completed"
    finally:
        record.close()


# ------------------------------------------------------- unreachable server


def test_while_the_database_is_unreachable_the_api_answers_503_at_once_and_recovers_by_itself(
    settings: Settings, database: Database
) -> None:
    """The server vanishes behind a proxy (every connection cut, new ones refused), then returns."""
    proxy = Proxy(database.params)
    proxy.up()
    through = {**database.params, "host": "127.0.0.1", "port": proxy.port}
    app = create_app(
        settings.model_copy(update={"database_url": make_conninfo(**through)}),
        role="all",
        options=FAST,
    )
    try:
        with live_server(app) as url:
            session_id = httpx.post(f"{url}/v1/sessions", json={}, timeout=30).json()["session_id"]
            proxy.down()
            answers = [
                _timed(url, method, path, body) for method, path, body in _requests(session_id)
            ]
            session = f"{url}/v1/sessions/{session_id}"
            with _traffic(session):
                time.sleep(8.0)  # an outage long enough for the pool's reconnection to back off
                proxy.up()
                back = time.monotonic()
                poll(lambda: httpx.get(session, timeout=30).status_code == 200, 30, "serving")
                recovered_after = time.monotonic() - back
            done = httpx.post(
                f"{url}/v1/sessions/{session_id}/turns?wait=30",
                json={"message": "back"},
                timeout=40,
            )
            assert done.status_code == 200 and done.json()["state"] == "completed", done.text
            # The read models follow by themselves; their runners restart after a
            # backoff of at most 5 s (projections.leadership.MAX_BACKOFF) once it is back.
            position = {"min_position": done.json()["position"]}
            poll(
                lambda: httpx.get(f"{url}/v1/sessions", params=position).status_code == 200,
                30,
                "the read models caught up",
            )
    finally:
        proxy.down()
    for status, retry_after, seconds in answers:
        assert (status, bool(retry_after)) == (503, True), answers
        assert seconds < scaled(3.0), answers  # at once, not after the pool's patience (50-100 s)
    assert recovered_after < scaled(3.0)


@contextmanager
def _traffic(url: str, clients: int = 12) -> Iterator[None]:
    """Clients reading ``url`` in a loop, as traffic through an outage and its end would be."""
    stop = threading.Event()

    def ask() -> None:
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(url, timeout=30)

    threads = [threading.Thread(target=ask) for _ in range(clients)]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join()


def _requests(session_id: str) -> list[tuple[str, str, dict[str, Any] | None]]:
    return [
        ("GET", f"/v1/sessions/{session_id}", None),
        ("POST", f"/v1/sessions/{session_id}/turns", {"message": "while down"}),
        ("GET", "/v1/sessions", None),
        ("POST", "/v1/sessions", {}),
        ("GET", f"/v1/sessions/{session_id}/events", None),
    ]


def _timed(
    url: str, method: str, path: str, body: dict[str, Any] | None
) -> tuple[int, str | None, float]:
    started = time.monotonic()
    response = httpx.request(method, url + path, json=body, timeout=120)
    return response.status_code, response.headers.get("retry-after"), time.monotonic() - started


# ---------------------------------------------------------------- restarts

LOCAL_SERVER = ("127.0.0.1", "5432")


def _restart_refusal() -> str:
    if os.environ.get("TURNLOG_CHAOS") != "1":
        return "restarts the PostgreSQL server: runs under `make chaos` (TURNLOG_CHAOS=1)"
    url = os.environ.get("TURNLOG_TEST_DATABASE_URL", "")
    params = conninfo_to_dict(url) if url else {}
    if (params.get("host"), str(params.get("port", "5432"))) != LOCAL_SERVER:
        return "needs TURNLOG_TEST_DATABASE_URL at the machine's own server, 127.0.0.1:5432"
    if not shutil.which("pg_ctlcluster") or not _cluster_version():
        return "needs pg_ctlcluster and a cluster in /etc/postgresql to restart the server"
    return ""


def _cluster_version() -> str:
    versions = sorted(p.name for p in Path("/etc/postgresql").glob("*") if p.is_dir())
    return versions[-1] if versions else ""


def pg_ctl(action: str) -> None:
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", _cluster_version(), "main", action]
        + (["-m", "fast"] if action == "stop" else []),
        check=True,
        capture_output=True,
        timeout=120,
    )


restarts_the_server = pytest.mark.skipif(bool(_restart_refusal()), reason=_restart_refusal())


@pytest.fixture
def server_left_running() -> Iterator[None]:
    """Whatever happens in the test, the server is running again afterwards."""
    try:
        yield
    finally:
        if _server_down():
            pg_ctl("start")


def _server_down() -> bool:
    done = subprocess.run(
        ["pg_isready", "-h", LOCAL_SERVER[0], "-p", LOCAL_SERVER[1]], capture_output=True
    )
    return done.returncode != 0


@pytest.mark.chaos
@restarts_the_server
@pytest.mark.timeout(300)
def test_a_postgresql_restart_under_load_is_503_while_down_and_recovers_by_itself(
    settings: Settings, database: Database, server_left_running: None
) -> None:
    with cluster(settings, database) as c:
        c.api("api")
        c.projections()
        for name in ("w1", "w2"):
            c.worker(name)
        workload = Workload(c, clients=4)
        workload.start()
        session_id = c.new_session()
        poll(lambda: len(workload.acknowledged) >= 10, 60, "some load")
        session = f"{c.api_url}/v1/sessions/{session_id}"
        with _traffic(session):
            down_answers = _while_down(c, session_id)
            time.sleep(15.0)  # down long enough for the pools' reconnection to back off
            pg_ctl("start")
            back = time.monotonic()
            poll(lambda: httpx.get(session, timeout=30).status_code == 200, 60, "serving")
            recovered_after = time.monotonic() - back
        poll(lambda: _ready(c.api_url), 60, "the API ready again by itself")
        before = len(workload.acknowledged)
        poll(lambda: len(workload.acknowledged) >= before + 10, 90, "turns after the restart")
        workload.finish()
        assert not workload.errors, workload.errors
        record = Record(c.settings, c.database)
        try:
            findings = check(record.refresh(), list(workload.acknowledged))
            states = [final_state(record.by_turn()[t]) for t in workload.acknowledged]
        finally:
            record.close()
    assert findings.ok, findings
    assert set(states) <= {"completed", "abandoned"}, states
    for status, retry_after, seconds in down_answers:
        assert status == 503 and retry_after, down_answers
        assert seconds < scaled(5.0), down_answers  # at once, not after the pool's patience
    # Not after the pool's reconnection backoff (1, 2, 4, 8, 16 s …), which once
    # kept the API answering 503 for ~10 s after a 20-s outage had ended.
    assert recovered_after < scaled(3.0), recovered_after


def _while_down(c: Cluster, session_id: str) -> list[tuple[int, str | None, float]]:
    """Stop the server (left stopped); what the API answers meanwhile."""
    answers = []
    pg_ctl("stop")
    try:
        for method, path, body in (
            ("POST", f"/v1/sessions/{session_id}/turns", {"message": "while down"}),
            ("GET", f"/v1/sessions/{session_id}", None),
            ("GET", "/v1/sessions", None),
            ("POST", "/v1/sessions", {}),
        ):
            started = time.monotonic()
            response = httpx.request(method, c.api_url + path, json=body, timeout=120)
            answers.append(
                (
                    response.status_code,
                    response.headers.get("retry-after"),
                    time.monotonic() - started,
                )
            )
    except BaseException:
        pg_ctl("start")
        raise
    return answers


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False
