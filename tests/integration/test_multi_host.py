"""A multi-host URL works everywhere turnlog connects: pools, the LISTEN connection, leases.

The URL names a server that refuses connections first and the test server
second, with ``target_session_attrs=read-write`` (a failover's URL): every
connection must try them in turn and end on the writable one. And the URL's
parameters reach the pools (a ``target_session_attrs`` the server cannot meet
makes the pool fail, where it used to be dropped).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eventsourcing.persistence import OperationalError
from psycopg.conninfo import make_conninfo

from tests.deadlines import poll, scaled
from tests.fault.cluster import free_port
from turnlog.application.errors import DatabaseUnavailable
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database, library_env, locate
from turnlog.application.store.pool import TurnlogFactory, failing_fast
from turnlog.interface.bootstrap import Process, build_process
from turnlog.interface.roles import Role


def multi_host(database: Database, **extra: str) -> str:
    """The test server's conninfo, a refusing server named before it."""
    params: dict[str, Any] = dict(database.params)
    host = str(params.get("host") or "127.0.0.1")
    port = str(params.get("port") or 5432)
    params.update(host=f"{host},{host}", port=f"{free_port()},{port}", **extra)
    return make_conninfo(**params)


@pytest.fixture
def multi_settings(settings: Settings, database: Database) -> Settings:
    url = multi_host(database, target_session_attrs="read-write")
    return settings.model_copy(update={"database_url": url})


@pytest.fixture
def process(multi_settings: Settings) -> Iterator[Process]:
    process = build_process(multi_settings, Role.ALL).start()
    yield process
    process.stop(drain_timeout=5)


def test_a_turn_runs_on_a_multi_host_url(process: Process, multi_settings: Settings) -> None:
    runtime, follower, read = process.runtime, process.follower, process.read_models
    assert runtime is not None and follower is not None and read is not None
    db = runtime.db
    assert len(db.hosts) == 2 and db.params["target_session_attrs"] == "read-write"
    assert ",".join(db.hosts) in db.describe() and "(read-write)" in db.describe()
    pool: Any = runtime.sessions.recorder.datastore.pool  # type: ignore[attr-defined]
    assert pool.kwargs["target_session_attrs"] == "read-write"
    assert pool.kwargs["host"] == db.params["host"]
    poll(lambda: follower.listening, 10, "the follower's LISTEN connection")

    created = runtime.sessions.create_session(title="multi-host")
    submitted = runtime.sessions.submit_turn(created.session_id, "hello")

    # The worker took the session's lease (its own connection) and ran the turn.
    def completed() -> bool:
        _, turn = runtime.sessions.turn_record(created.session_id, submitted.turn_id)
        return str(turn.state) == "completed"

    poll(completed, 20, "the turn to complete")
    assert runtime.leases.opened >= 1
    assert read.wait_for(submitted.position, timeout=scaled(10))  # the follower fed the runners


def test_the_urls_parameters_reach_the_pool(
    database: Database, settings: Settings, tmp_path: Path
) -> None:
    # The test server is a primary: a pool that must find a standby finds none.
    url = make_conninfo(database.conninfo, target_session_attrs="standby")
    db = locate(Settings(database_url=url, data_dir=tmp_path))
    env = library_env(db, settings, create_table=False)
    assert "target_session_attrs=standby" in env["TURNLOG_CONNINFO_EXTRA"]
    factory = TurnlogFactory({**env, "POSTGRES_CONNECT_TIMEOUT": "2"})
    try:
        with pytest.raises(OperationalError), factory.datastore.get_connection():
            pass
        # Failing fast, the pool's probe says why: the server is not a standby.
        with (
            failing_fast(),
            pytest.raises(DatabaseUnavailable, match="standby"),
            factory.datastore.get_connection(),
        ):
            pass
    finally:
        factory.close()


def test_describe_names_every_host_without_the_password() -> None:
    url = "postgresql://u:secret@h1:5433,h2:5434/db?target_session_attrs=read-write"
    db = locate(Settings(database_url=url))
    assert db.hosts == ["h1:5433", "h2:5434"]
    assert db.describe() == "external PostgreSQL at h1:5433,h2:5434, database db (read-write)"
    assert "secret" not in db.describe()
    same_port = locate(Settings(database_url="postgresql://u@h1,h2/db"))
    assert same_port.hosts == ["h1:5432", "h2:5432"]
