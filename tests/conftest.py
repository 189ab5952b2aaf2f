"""Shared fixtures: a real PostgreSQL and a fresh namespace per test.

The server is the embedded one (kept under .turnlog/test-pg and reused
between runs) unless TURNLOG_TEST_DATABASE_URL names another.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from turnlog.application.database import Database, embedded_running, locate, stop_embedded
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.interface.bootstrap import build_runtime

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def database() -> Iterator[Database]:
    url = os.environ.get("TURNLOG_TEST_DATABASE_URL")
    if url:
        yield locate(Settings(database_url=url))
        return
    data_dir = ROOT / ".turnlog" / "test"
    started_here = not embedded_running(data_dir)
    yield locate(Settings(data_dir=data_dir))
    if started_here:
        # Leave the machine as we found it: a fresh clone's run stops its server.
        stop_embedded(data_dir)


@pytest.fixture
def namespace(database: Database) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    drop_namespace(database, name)


def drop_namespace(database: Database, name: str) -> None:
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(f"turnlog_{name}"))
        )


@pytest.fixture
def settings(database: Database, namespace: str, tmp_path: Path) -> Settings:
    return Settings(
        database_url=database.conninfo,
        namespace=namespace,
        data_dir=tmp_path / "data",
        snapshot_interval=50,
    )


@pytest.fixture
def runtime(settings: Settings) -> Iterator[Runtime]:
    rt = build_runtime(settings)
    yield rt
    rt.close()


def turnlog_env(settings: Settings, **extra: str) -> dict[str, str]:
    """Environment for a `turnlog` subprocess using the same database and namespace."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNLOG_")}
    env.update(
        TURNLOG_DATABASE_URL=settings.database_url or "",
        TURNLOG_NAMESPACE=settings.namespace,
        TURNLOG_DATA_DIR=str(settings.data_dir),
        TURNLOG_SNAPSHOT_INTERVAL=str(settings.snapshot_interval),
    )
    env.update(extra)
    return env


def turnlog(
    settings: Settings, *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run the `turnlog` command in a new process and wait for it."""
    return subprocess.run(
        [sys.executable, "-m", "turnlog", *args],
        capture_output=True,
        text=True,
        env=turnlog_env(settings),
        cwd=ROOT,
        timeout=timeout,
    )


def spawn_turnlog(settings: Settings, *args: str) -> subprocess.Popen[str]:
    """Start the `turnlog` command in a new process without waiting."""
    return subprocess.Popen(
        [sys.executable, "-m", "turnlog", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=turnlog_env(settings),
        cwd=ROOT,
    )


def raw_events(database: Database, namespace: str, session_id: Any = None) -> list[tuple[Any, ...]]:
    """(position, session, version, topic) rows straight from the events table."""
    query = sql.SQL(
        "SELECT notification_id, originator_id, originator_version, topic FROM {}.sessions_events"
        " {} ORDER BY notification_id"
    ).format(
        sql.Identifier(f"turnlog_{namespace}"),
        sql.SQL("WHERE originator_id = %s") if session_id else sql.SQL(""),
    )
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        return conn.execute(query, (session_id,) if session_id else None).fetchall()
