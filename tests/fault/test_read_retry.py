"""A read, or a write, whose connection dies mid-query is answered.

The test holds an exclusive lock on the sessions read model's table, so the
API's ``GET /v1/sessions`` waits inside its query; the backend running that
query is terminated (``pg_terminate_backend``), then the lock is let go. The
server is up all along: the client gets 200, from a second attempt on a
fresh connection. (An unreachable server still gets 503 at once:
tests/fault/test_database_faults.py.)
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.deadlines import scaled
from tests.fault.cluster import Cluster, cluster, poll
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database
from turnlog.projections.catalog import READ_MODELS

pytestmark = pytest.mark.fault


@pytest.fixture
def served(settings: Settings, database: Database) -> Iterator[Cluster]:
    with cluster(settings, database) as c:
        c.api("api", PGAPPNAME=app_name(settings))
        yield c


def app_name(settings: Settings) -> str:
    return f"tl-{settings.namespace}-api"


def waiting_reads(c: Cluster) -> list[int]:
    """Server pids of the API's connections waiting for a lock."""
    with psycopg.connect(c.database.conninfo, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
            " AND wait_event_type = 'Lock'",
            (app_name(c.settings),),
        ).fetchall()
    return [int(r[0]) for r in rows]


def gone(c: Cluster, pid: int) -> bool:
    with psycopg.connect(c.database.conninfo, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,))
        return (row.fetchone() or (0,))[0] == 0


def test_a_read_whose_connection_is_terminated_mid_query_is_answered_200(
    served: Cluster,
) -> None:
    c = served
    session_id = c.new_session()
    table = sql.Identifier(
        c.settings.schema_name, READ_MODELS["sessions"].tracking_table.removesuffix("_tracking")
    )
    with (
        psycopg.connect(c.database.conninfo) as locker,
        ThreadPoolExecutor(1) as client,
    ):
        locker.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(table))
        answer = client.submit(c.request, "GET", "/v1/sessions")
        (pid,) = poll(lambda: waiting_reads(c), 30, "the read waiting inside its query")
        c.terminate_backend(pid)
        poll(lambda: gone(c, pid), 10, "the terminated backend gone")
        locker.commit()  # the lock goes: a second attempt can read
        response = answer.result(timeout=scaled(60))
    assert response.status_code == 200, response.text
    assert response.json()["items"] is not None
    output = next(p for p in c.processes if p.name.startswith("api")).output()
    assert "trying once more" in output
    # The session is there for whoever reads next, and nothing else failed.
    assert c.request("GET", f"/v1/sessions/{session_id}").status_code == 200


def _terminated_mid_write(c: Cluster, headers: dict[str, str]) -> object:
    """POST /v1/sessions held inside its insert, its backend terminated, then let go."""
    events = sql.Identifier(c.settings.schema_name, "sessions_events")
    with (
        psycopg.connect(c.database.conninfo) as locker,
        ThreadPoolExecutor(1) as client,
    ):
        # SHARE: reads go on (the key is looked up first), the insert waits.
        locker.execute(sql.SQL("LOCK TABLE {} IN SHARE MODE").format(events))
        answer = client.submit(
            c.request, "POST", "/v1/sessions", json={"title": "keyed"}, headers=headers
        )
        (pid,) = poll(lambda: waiting_reads(c), 30, "the write waiting inside its insert")
        c.terminate_backend(pid)
        poll(lambda: gone(c, pid), 10, "the terminated backend gone")
        locker.commit()
        return answer.result(timeout=scaled(60))


def _titled(c: Cluster, title: str) -> int:
    events = sql.Identifier(c.settings.schema_name, "sessions_events")
    query = sql.SQL(
        "SELECT count(*) FROM {} WHERE topic LIKE %s AND convert_from(state, 'UTF8') LIKE %s"
    )
    with psycopg.connect(c.database.conninfo, autocommit=True) as conn:
        row = conn.execute(query.format(events), ("%SessionStarted%", f'%"{title}"%')).fetchone()
    return int(row[0]) if row else 0


def test_a_write_under_an_idempotency_key_whose_connection_dies_is_answered_once(
    served: Cluster,
) -> None:
    c = served
    response: Any = _terminated_mid_write(c, {"Idempotency-Key": "one-session-please"})
    assert response.status_code == 201, response.text
    assert _titled(c, "keyed") == 1  # written once, whichever attempt wrote it
    output = next(p for p in c.processes if p.name.startswith("api")).output()
    assert "commit got no answer" in output


def test_a_write_without_a_key_whose_connection_dies_is_settled_by_reading_back(
    served: Cluster,
) -> None:
    """No key to retry under: the stream is read back, and the save written once."""
    c = served
    response: Any = _terminated_mid_write(c, {})
    assert response.status_code == 201, response.text
    assert _titled(c, "keyed") == 1  # not stored when the connection died: written again, once
    output = next(p for p in c.processes if p.name.startswith("api")).output()
    assert "settled: not stored: written again" in output
