"""Namespaces on different servers: ``TURNLOG_NAMESPACE_DATABASE_URLS``, or a
``database_url`` in the tenants file.

One set of settings names a second database for one namespace (a stand-in
for a second cluster); every process of that namespace works there, every
other namespace on ``DATABASE_URL``. The first test runs a process of each
from the same settings; the second runs one `turnlog serve` over both, from a tenants
file, and looks where each namespace wrote.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from tests.conftest import ROOT, drop_namespace, turnlog_env
from tests.deadlines import poll, scaled
from tests.e2e.test_serve import server
from tests.tenants_support import TenantsFile
from turnlog.application.settings import Settings, schema_name
from turnlog.application.store.database import Database, locate
from turnlog.interface.bootstrap import build_process
from turnlog.interface.roles import Role


@pytest.fixture
def second_database(database: Database) -> Iterator[Database]:
    name = f"turnlog_second_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield Database({**database.params, "dbname": name}, embedded=False)
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def schemas(db: Database) -> set[str]:
    with psycopg.connect(db.conninfo, autocommit=True) as conn:
        rows = conn.execute("SELECT nspname FROM pg_namespace").fetchall()
    return {str(r[0]) for r in rows}


def test_each_namespace_works_on_its_own_server(
    settings: Settings, database: Database, second_database: Database
) -> None:
    here = settings.namespace
    there = f"t_{uuid.uuid4().hex[:12]}"
    urls = {there: make_conninfo(second_database.conninfo)}
    common: dict[str, Any] = {"namespace_database_urls": urls}
    mine = settings.model_copy(update=common)
    theirs = settings.model_copy(update={**common, "namespace": there})
    assert locate(mine).params["dbname"] == database.params["dbname"]
    assert locate(theirs).params["dbname"] == second_database.params["dbname"]

    try:
        for each in (mine, theirs):
            process = build_process(each, Role.ALL).start()
            try:
                runtime = process.runtime
                assert runtime is not None
                session = runtime.sessions.create_session(title=each.namespace)
                turn = runtime.sessions.submit_turn(session.session_id, "hello").turn_id

                def done(rt: Any = runtime, sid: Any = session.session_id, tid: str = turn) -> bool:
                    return str(rt.sessions.turn_record(sid, tid)[1].state) == "completed"

                poll(done, 20, f"the turn of {each.namespace}")
            finally:
                process.stop(drain_timeout=5)

        assert schema_name(here) in schemas(database)
        assert schema_name(here) not in schemas(second_database)
        assert schema_name(there) in schemas(second_database)
        assert schema_name(there) not in schemas(database)

        # The command line reads the same setting from the environment.
        env_settings = settings.model_copy(update={"namespace": there})
        extra = {"TURNLOG_NAMESPACE_DATABASE_URLS": json.dumps(urls)}
        status = subprocess.run(
            [sys.executable, "-m", "turnlog", "db", "status", "--json"],
            capture_output=True,
            text=True,
            env=turnlog_env(env_settings, **extra),
            cwd=ROOT,
            timeout=scaled(60),
        )
        assert status.returncode == 0, status.stdout + status.stderr
        assert second_database.params["dbname"] in status.stdout
    finally:
        drop_namespace(second_database, there)


def test_one_server_serves_namespaces_on_two_clusters(
    settings: Settings, database: Database, second_database: Database, tmp_path: Path
) -> None:
    here, there = f"{settings.namespace}_h", f"{settings.namespace}_t"
    file = TenantsFile(tmp_path / "tenants.toml")
    file.token("near", here, "client")
    file.token("far", there, "client")
    file.write()
    url = "postgresql://?" + urlencode({k: v for k, v in second_database.params.items() if v})
    file.path.write_text(
        file.path.read_text() + f'\n[namespaces.{there}]\ndatabase_url = "{url}"\n'
    )
    served = settings.model_copy(update={"tenants_file": file.path, "namespace": here})
    try:
        with server(served, tmp_path / "serve.log") as (_, url), httpx.Client(base_url=url) as http:
            for token in ("near", "far"):
                headers = file.headers(token)
                sid = http.post("/v1/sessions", json={}, headers=headers).json()["session_id"]
                done = http.post(
                    f"/v1/sessions/{sid}/turns?wait=30",
                    json={"message": "hi"},
                    headers=headers,
                    timeout=60,
                )
                assert done.status_code == 200 and done.json()["state"] == "completed", done.text
                # The other namespace's token does not see it, on either cluster.
                other = file.headers("far" if token == "near" else "near")
                assert http.get(f"/v1/sessions/{sid}", headers=other).status_code == 404
        assert schema_name(here) in schemas(database)
        assert schema_name(here) not in schemas(second_database)
        assert schema_name(there) in schemas(second_database)
        assert schema_name(there) not in schemas(database)
    finally:
        drop_namespace(database, here)
        drop_namespace(second_database, there)


def test_a_namespace_url_map_must_name_namespaces() -> None:
    with pytest.raises(ValueError, match="invalid namespace"):
        Settings(namespace_database_urls={"Not A Namespace": "postgresql://h/db"})
