"""Reading the log's tail: are rows waiting past the horizon? At a cost fixed in the log's length.

Every process's follower (and every catching-up runner) reads the tail after
each commit. The read also says whether committed rows wait past the commit
horizon (``pending``): it once answered that with a scan of the whole events
table, so each read cost more the longer the namespace had lived.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from tests.deadlines import poll
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.application.store import logorder
from turnlog.application.store.logorder import Place


def _table(settings: Settings) -> sql.Composed:
    return logorder.table(settings.schema_name, "sessions_events")


def _insert(conn: psycopg.Connection[Any], settings: Settings, count: int) -> None:
    """``count`` events of new sessions, in one transaction (a foreign writer's rows)."""
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (originator_id, originator_version, topic, state)"
            " SELECT gen_random_uuid(), 1, 'test:Row', '\\x7b7d'::bytea FROM generate_series(1, %s)"
        ).format(_table(settings)),
        (count,),
    )


def _read_at_head(conn: psycopg.Connection[Any], settings: Settings) -> tuple[bool, int]:
    """A read from the log's last row: its ``pending`` flag and the buffers the server touched."""
    with conn.cursor(row_factory=dict_row) as curs:
        head = logorder.current_horizon(curs)
        row = curs.execute(
            sql.SQL("SELECT max({}) ::text AS x, max(notification_id) AS n FROM {}").format(
                logorder.XACT, _table(settings)
            )
        ).fetchone()
        assert row is not None
        after = Place(int(row["x"]), int(row["n"])) if row["n"] is not None else Place.start()
        page = logorder.read_log(curs, _table(settings), after, 1000)
        assert page.records == [] and head > 0
        plan = curs.execute(
            sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ")
            + logorder.read_statement(_table(settings), stop=False),
            [*after.params(), 1000],
        ).fetchone()
    assert plan is not None
    return page.pending, _buffers(plan["QUERY PLAN"][0]["Plan"])


def _buffers(node: dict[str, Any]) -> int:
    own = int(node.get("Shared Hit Blocks", 0)) + int(node.get("Shared Read Blocks", 0))
    return max([own, *(_buffers(child) for child in node.get("Plans", []))])


def test_a_read_says_pending_only_while_committed_rows_wait_past_the_horizon(
    runtime: Runtime, settings: Settings
) -> None:
    conninfo = runtime.db.conninfo
    with psycopg.connect(conninfo, autocommit=True) as conn:
        # The horizon is the server's: another client's open transaction holds it
        # back too, so "nothing pending" may take until that one ends.
        poll(lambda: not _read_at_head(conn, settings)[0], 30, "an empty log, nothing pending")
        _insert(conn, settings, 3)
        poll(lambda: not _read_at_head(conn, settings)[0], 30, "every row below the horizon")

        with psycopg.connect(conninfo) as older:  # an open transaction holds the horizon back
            older.execute("SELECT pg_current_xact_id()")
            _insert(conn, settings, 1)  # committed after it began
            with conn.cursor(row_factory=dict_row) as curs:
                page = logorder.read_log(curs, _table(settings), Place.start(), 1000)
            assert page.pending is True
            assert len(page.records) == 3  # the later row waits for the older transaction
            older.rollback()

        def all_four() -> bool:
            with conn.cursor(row_factory=dict_row) as curs:
                page = logorder.read_log(curs, _table(settings), Place.start(), 1000)
            return not page.pending and len(page.records) == 4

        poll(all_four, 30, "the held-back row to be read once the older transaction ended")


def test_a_read_at_the_head_touches_as_many_pages_after_20_000_events_as_after_200(
    runtime: Runtime, settings: Settings
) -> None:
    with psycopg.connect(runtime.db.conninfo, autocommit=True) as conn:
        _insert(conn, settings, 200)
        _, small = _read_at_head(conn, settings)
        _insert(conn, settings, 19_800)
        _, large = _read_at_head(conn, settings)
    # The scan it replaced touched every page of the table (4 pages, then 209); an
    # index probe touches one page more for each level the index grows.
    assert large <= small + 6, (small, large)
