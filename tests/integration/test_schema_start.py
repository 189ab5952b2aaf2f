"""A process start takes no lock that queues the namespace's writers.

Creating an index that already exists still takes the table's SHARE lock
in PostgreSQL, which waits for every open write transaction, and every
later writer queues behind it. A start therefore checks the catalog first
and creates nothing that is there.
"""

from __future__ import annotations

import threading
import time

import psycopg
from psycopg import sql

from tests import deadlines
from tests.conftest import spawn_turnlog, turnlog
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.application.store import logorder

HELD = 120.0  # a bound far above every wait here; the held transaction ends only at the end
START = 20.0  # a `turnlog sessions list` start and answer on a busy machine


def test_a_start_and_a_write_do_not_wait_for_an_open_write_transaction(
    runtime: Runtime, settings: Settings
) -> None:
    runtime.sessions.create_session(title="before")
    holder = psycopg.connect(str(settings.database_url))
    try:
        holder.execute(
            sql.SQL("LOCK TABLE {}.sessions_events IN ROW EXCLUSIVE MODE").format(
                sql.Identifier(settings.schema_name)
            )
        )
        started = time.monotonic()
        listing = spawn_turnlog(settings, "sessions", "list")
        try:
            listing.communicate(timeout=min(deadlines.scaled(START), HELD / 2))
        except Exception:
            listing.kill()
            listing.communicate()
            raise AssertionError(
                f"`turnlog sessions list` waited {time.monotonic() - started:.0f}s"
                " behind an open write transaction"
            ) from None
        assert listing.returncode == 0, listing.stderr

        # A write while another process starts.
        starting = spawn_turnlog(settings, "sessions", "list")
        written: list[object] = []
        writer = threading.Thread(
            target=lambda: written.append(runtime.sessions.create_session(title="during"))
        )
        writer.start()
        writer.join(timeout=min(deadlines.scaled(START), HELD / 2))
        starting.communicate(timeout=min(deadlines.scaled(START), HELD / 2))
        assert written, "a write waited behind a starting process"
        assert starting.returncode == 0, starting.stderr
    finally:
        holder.close()


def test_only_an_owner_migrates_and_it_gives_up_on_a_held_table(
    runtime: Runtime, settings: Settings
) -> None:
    runtime.sessions.create_session(title="before")
    runtime.close()
    schema = sql.Identifier(settings.schema_name)
    index = sql.Identifier(settings.schema_name, logorder.index_name("sessions_events"))
    with psycopg.connect(str(settings.database_url), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP INDEX {}").format(index))  # what an older version left

    def has_index() -> bool:
        with psycopg.connect(str(settings.database_url), autocommit=True) as conn:
            name = f"{settings.schema_name}.{logorder.index_name('sessions_events')}"
            row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", [name]).fetchone()
            return bool(row and row[0])

    holder = psycopg.connect(str(settings.database_url))
    try:
        holder.execute(
            sql.SQL("LOCK TABLE {}.sessions_events IN ROW EXCLUSIVE MODE").format(schema)
        )
        # A one-shot read does not migrate: it says what to run, at once.
        listing = turnlog(settings, "sessions", "list", timeout=START)
        assert listing.returncode == 5, listing.stdout + listing.stderr
        assert "turnlog db init" in listing.stderr.replace("\n", " "), listing.stderr
        # The owner waits SCHEMA_LOCK_TIMEOUT at most, not for the held transaction.
        started = time.monotonic()
        init = turnlog(settings, "db", "init", timeout=START)
        assert init.returncode == 5, init.stdout + init.stderr
        assert "holds it" in init.stderr.replace("\n", " "), init.stderr
        assert time.monotonic() - started < HELD / 2
        assert not has_index()  # nothing was changed
    finally:
        holder.close()
    init = turnlog(settings, "db", "init", timeout=START)
    assert init.returncode == 0, init.stdout + init.stderr
    assert has_index()
    assert turnlog(settings, "sessions", "list", timeout=START).returncode == 0
