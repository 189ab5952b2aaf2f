"""Each role holds the connections docs/operations.md says: its pool plus its own ones.

A real `turnlog serve --role R` per role, with PGAPPNAME naming its
connections (runner connections name themselves after the process id). At
rest, the connections outside the pool — a LISTEN, a lock, a heartbeat — are
what the connection-budget table of the operations guide counts.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.conftest import ROOT, turnlog_env
from tests.deadlines import scaled
from tests.e2e.test_serve import wait_ready
from tests.fault.cluster import free_port
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database

pytestmark = pytest.mark.fault

# Own connections at rest (no turn running, so no lease): the "own connections"
# column of docs/operations.md: the follower's one LISTEN, one per lock or heartbeat.
OWN_AT_REST = {"api": 1, "projections": 1 + 3, "worker": 1 + 1, "all": 1 + 3 + 1}


def backends(database: Database, app_name: str, pid: int) -> int:
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        names = conn.execute(
            "SELECT application_name FROM pg_stat_activity WHERE backend_type = 'client backend'"
        ).fetchall()
    return sum(1 for (name,) in names if name == app_name or name.endswith(f":{pid}"))


def pool_open(url: str) -> int:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    found = re.search(r'turnlog_db_pool_connections\{pool="sessions",state="open"\} (\S+)', text)
    assert found, "no pool metric"
    return int(float(found.group(1)))


@pytest.mark.parametrize("role", list(OWN_AT_REST))
def test_a_role_holds_its_pool_and_the_connections_the_guide_counts(
    role: str, settings: Settings, database: Database, tmp_path: Path
) -> None:
    app_name = f"budget-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "serve.log"
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "turnlog", "serve", "--port", str(port), "--role", role],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=turnlog_env(settings, PGAPPNAME=app_name),
            cwd=ROOT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, url, log)
        own = -1
        end = time.monotonic() + scaled(15)  # the worker's heartbeat connects after its first 2 s
        while time.monotonic() < end:
            before = backends(database, app_name, proc.pid)
            pooled = pool_open(url)
            if backends(database, app_name, proc.pid) == before:
                own = before - pooled
                if own == OWN_AT_REST[role]:
                    break
            time.sleep(0.2)
        assert own == OWN_AT_REST[role], f"{role}: {own} connections outside the pool"
    finally:
        proc.kill()
        proc.wait(30)
