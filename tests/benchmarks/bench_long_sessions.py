"""Figures 9 and 10: what a long session costs to keep and to show.

Figure 9: the bytes a session stores per turn (its event rows and its
snapshot rows), 5,000 turns against 100, with and without a context-window
policy. Figure 10: ``GET /v1/sessions/{id}`` from a real `turnlog serve`,
body size and latency, 5,000 turns against 10. The sessions are written as
figure 3 writes them (``bench_load.seed_session``): the domain's own
commands, saved through the application with the default snapshot interval
for the last turns, so the snapshots are taken and pruned at save time.
"""

from __future__ import annotations

import time
from typing import Any
from uuid import UUID

import httpx
from psycopg import sql

from tests.benchmarks.bench_http import Serve
from tests.benchmarks.bench_load import POLICY_TURNS, seed_session
from tests.benchmarks.bench_throughput import Config
from tests.benchmarks.suite import Figure, Row, Stat, fmt, interleave, scratch_namespace
from turnlog.application.sessions import Sessions
from turnlog.application.settings import Settings
from turnlog.application.store import database
from turnlog.application.store.database import Database
from turnlog.interface.bootstrap import open_sessions

BIG = 5000


def seed(db: Database, settings: Settings, sizes: list[tuple[int, int | None]]) -> list[UUID]:
    """Sessions of the given (turns, context.max_turns), written as figure 3 writes them."""
    live = open_sessions(settings, db)
    bulk = Sessions(
        env=database.library_env(db, settings, create_table=False), snapshot_interval=10**9
    )
    try:
        return [seed_session(bulk, live, turns, max_turns) for turns, max_turns in sizes]
    finally:
        live.close()
        bulk.close()


def stored(db: Database, settings: Settings, session_id: UUID) -> dict[str, int]:
    """The session's rows and their bytes (``pg_column_size`` of each whole row)."""
    schema = sql.Identifier(settings.schema_name)
    out: dict[str, int] = {}
    with database.connect(db) as conn:
        for kind, column in (
            ("events", "originator_id"),
            ("snapshots", "originator_id"),
            ("finished_chunks", "session_id"),  # the snapshots' older finished-turn entries
        ):
            table = sql.SQL("{}.{}").format(schema, sql.Identifier(f"sessions_{kind}"))
            row = conn.execute(
                sql.SQL(
                    "SELECT count(*), coalesce(sum(pg_column_size(t.*)), 0)"
                    " FROM {} AS t WHERE {} = %s"
                ).format(table, sql.Identifier(column)),
                (session_id,),
            ).fetchone()
            out[f"{kind}_rows"], out[f"{kind}_bytes"] = (
                (int(row[0]), int(row[1])) if row else (0, 0)
            )
    return out


def figure_9(db: Database, cfg: Config) -> Figure:
    small = 100
    with scratch_namespace(db) as settings:
        started = time.monotonic()
        ids = seed(
            db,
            settings,
            [(BIG, None), (small, None), (BIG, POLICY_TURNS), (small, POLICY_TURNS)],
        )
        seeding = time.monotonic() - started
        facts = [stored(db, settings, session_id) for session_id in ids]
    per_turn = [
        (f["events_bytes"] + f["snapshots_bytes"] + f["finished_chunks_bytes"]) / turns
        for f, turns in zip(facts, [BIG, small, BIG, small], strict=True)
    ]
    rows = []
    for number, label, (big, base) in (
        ("9", "no context policy", (per_turn[0], per_turn[1])),
        ("9b", f"context.max_turns = {POLICY_TURNS}", (per_turn[2], per_turn[3])),
    ):
        ratio = big / base
        rows.append(
            Row(
                number,
                f"stored bytes per turn, {BIG:,} turns vs {small} ({label})",
                Stat([big], "B/turn"),
                Stat([base], "B/turn"),
                ratio,
                "≤ 1.5x",
                ratio <= 1.5,
            )
        )

    def described(f: dict[str, int]) -> str:
        return (
            f"{f['events_rows']:,} events ({fmt(f['events_bytes'] / 1e6)} MB) +"
            f" {f['snapshots_rows']} snapshots ({fmt(f['snapshots_bytes'] / 1e3)} kB) +"
            f" {f['finished_chunks_rows']} chunks ({fmt(f['finished_chunks_bytes'] / 1e3)} kB)"
        )

    return Figure(
        9,
        f"stored bytes per turn, {BIG:,}-turn session vs {small}-turn",
        rows,
        how=(
            f"Four sessions written as in figure 3 ({BIG:,} and {small} turns, each without and"
            f" with `context.max_turns = {POLICY_TURNS}`), the snapshots taken and the"
            " superseded ones pruned at save time with the default settings. Bytes per turn ="
            " the session's own rows in the events, snapshots and chunks tables, each row's"
            " `pg_column_size` summed, over its turns (per-stream sums: the tables' dead rows"
            " and index pages are not counted). No policy:"
            f" {described(facts[0])} vs {described(facts[1])}; with the policy:"
            f" {described(facts[2])} vs {described(facts[3])}. Seeding took {fmt(seeding)} s;"
            " the figure is a count, not a timing, so it is taken once."
        ),
        details={"stored": facts, "bytes_per_turn": per_turn, "seeding_seconds": seeding},
    )


def figure_10(db: Database, cfg: Config) -> Figure:
    requests = cfg.pick(40, 15)
    with scratch_namespace(db) as settings:
        started = time.monotonic()
        big_id, small_id = seed(db, settings, [(BIG, None), (10, None)])
        seeding = time.monotonic() - started
        serve = Serve(settings)
        try:
            with httpx.Client(base_url=serve.url, timeout=60) as http:
                sizes: dict[UUID, int] = {}
                first: dict[UUID, float] = {}

                def get(session_id: UUID) -> float:
                    began = time.perf_counter()
                    response = http.get(f"/v1/sessions/{session_id}")
                    elapsed = (time.perf_counter() - began) * 1000
                    response.raise_for_status()
                    sizes[session_id] = len(response.content)
                    return elapsed

                for session_id in (big_id, small_id):  # the first reads load (cold)
                    first[session_id] = get(session_id)
                big, small = interleave(requests, lambda: get(big_id), lambda: get(small_id))
        finally:
            serve.stop()
    return _figure_10(big, small, sizes[big_id], sizes[small_id], first, big_id, small_id, seeding)


def _figure_10(
    big: list[float],
    small: list[float],
    big_bytes: int,
    small_bytes: int,
    first: dict[UUID, float],
    big_id: UUID,
    small_id: UUID,
    seeding: float,
) -> Figure:
    t, b = Stat(big, "ms"), Stat(small, "ms")
    ratio, size_ratio = t.median / b.median, big_bytes / small_bytes
    details: dict[str, Any] = {
        "body_bytes": {"big": big_bytes, "small": small_bytes},
        "first_request_ms": {"big": first[big_id], "small": first[small_id]},
        "seeding_seconds": seeding,
    }
    return Figure(
        10,
        f"GET /v1/sessions/{{id}}, {BIG:,} turns vs 10",
        [
            Row(
                "10",
                f"GET /v1/sessions/{{id}} body, {BIG:,} turns vs 10",
                Stat([big_bytes], "B"),
                Stat([small_bytes], "B"),
                size_ratio,
                "≤ 2x",
                size_ratio <= 2,
            ),
            Row(
                "10b",
                f"GET /v1/sessions/{{id}} latency, {BIG:,} turns vs 10",
                t,
                b,
                ratio,
                "≤ 2x",
                ratio <= 2,
            ),
        ],
        how=(
            f"Two sessions written as in figure 3 ({BIG:,} and 10 turns, no context policy);"
            " one `turnlog serve --role all` with default settings; one `httpx` client on a"
            f" kept-alive connection asks `GET /v1/sessions/{{id}}` {len(big)} times for each,"
            " alternately, after one first request each (which loads the session into the"
            f" server's cache: {fmt(first[big_id])} ms and {fmt(first[small_id])} ms). Body ="
            " the bytes of the JSON answer; latency = request sent to body read, in the client."
            f" Seeding took {fmt(seeding)} s."
        ),
        details=details,
    )
