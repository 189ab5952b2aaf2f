"""Figure 3: loading a long session and building its next request, in a cold process cache.

A session of 5,000 turns (the figure-1 turn: one tool call each) is written
by the domain's own commands and saved through the application in chunks,
so the application takes its snapshots at save time with the default
interval, exactly as a live session would get them. Each measurement opens a
fresh ``Sessions`` (nothing cached), then times ``get_session`` +
``next_request``; the baseline is the same for a 10-turn session.
"""

from __future__ import annotations

import time
from typing import Any
from uuid import UUID

from psycopg import sql

from tests.benchmarks.bench_throughput import Config
from tests.benchmarks.suite import Figure, Row, Stat, fmt, interleave, scratch_namespace
from turnlog.application import database
from turnlog.application.database import Database
from turnlog.application.sessions import Sessions
from turnlog.application.settings import Settings
from turnlog.domain.session import Session
from turnlog.domain.turns import Effect
from turnlog.interface.bootstrap import open_sessions

WORKER = "bench-worker"
SAVE_EVERY = 25  # turns per save while seeding
LIVE_TURNS = 100  # the last turns are saved with the default snapshot interval


def tool_turn(session: Session, index: int) -> None:
    """The events the agent loop records for ``/tool echo`` with the fixture provider."""
    message = f'/tool echo {{"text": "benchmark {index}"}}'
    turn, _ = session.submit_turn(message)
    tid = turn.turn_id
    claim = session.claim_turn(tid, WORKER)
    call_id = f"call_{index}"
    call = {"call_id": call_id, "name": "echo", "arguments": {"text": f"benchmark {index}"}}
    session.record_model_reply(tid, claim, "", [call], {"input_messages": 4 * index + 1})
    attempt = session.start_tool_call(tid, claim, call_id, WORKER, Effect.READ_ONLY)
    session.record_tool_succeeded(tid, claim, call_id, attempt, {"text": f"benchmark {index}"})
    reply = f'Tool echo returned: {{"text": "benchmark {index}"}}'
    session.record_model_reply(tid, claim, reply, [], {"input_messages": 4 * index + 3})
    session.complete_turn(tid, claim, reply)


def seed_session(bulk: Sessions, live: Sessions, turns: int) -> UUID:
    """A session of ``turns`` turns; its last ``LIVE_TURNS`` saved by ``live``.

    ``bulk`` takes no snapshots (taking one reloads the session from the
    store, which makes seeding quadratic); ``live`` has the default interval
    and saves the last turns every ``SAVE_EVERY`` turns, so the latest
    snapshots are taken at save time, where a live session's would be.
    """
    session = Session.start(title=f"{turns} turns", tools=["echo"], model="fixture-1")
    for index in range(turns):
        tool_turn(session, index)
        if (index + 1) % SAVE_EVERY == 0:
            (bulk if index < turns - LIVE_TURNS else live).save(session)
    live.save(session)
    return session.id


def snapshot_facts(db: Database, settings: Settings, session_id: UUID) -> dict[str, Any]:
    """How many snapshots the session has, the latest one's version and size."""
    schema = sql.Identifier(settings.schema_name)
    with database.connect(db) as conn:
        row = conn.execute(
            sql.SQL(
                "SELECT count(*), max(originator_version),"
                " (SELECT length(state) FROM {}.sessions_snapshots WHERE originator_id = %s"
                "  ORDER BY originator_version DESC LIMIT 1)"
                " FROM {}.sessions_snapshots WHERE originator_id = %s"
            ).format(schema, schema),
            (session_id, session_id),
        ).fetchone()
        version = conn.execute(
            sql.SQL(
                "SELECT max(originator_version) FROM {}.sessions_events WHERE originator_id = %s"
            ).format(schema),
            (session_id,),
        ).fetchone()
    count, latest, size = row or (0, None, None)
    return {
        "snapshots": count,
        "latest_snapshot_version": latest,
        "latest_snapshot_bytes": size,
        "version": version[0] if version else None,
    }


class Loader:
    """Times cold loads; keeps the split between loading and building the request."""

    def __init__(self, db: Database, settings: Settings) -> None:
        self.db = db
        self.settings = settings
        self.parts: dict[UUID, list[tuple[float, float]]] = {}
        self.messages: dict[UUID, int] = {}

    def __call__(self, session_id: UUID) -> float:
        sessions = Sessions(
            env=database.library_env(self.db, self.settings, create_table=False),
            snapshot_interval=self.settings.snapshot_interval,
        )
        try:
            started = time.perf_counter()
            session = sessions.get_session(session_id)
            loaded = time.perf_counter()
            request = sessions.request_for(session)  # earlier turns read by range
            done = time.perf_counter()
        finally:
            sessions.close()
        self.parts.setdefault(session_id, []).append((loaded - started, done - loaded))
        self.messages[session_id] = len(request.messages)
        return (done - started) * 1000


def figure_3(db: Database, cfg: Config) -> Figure:
    big_turns = 5000
    repeat = max(cfg.repeat, 3 if cfg.quick else 5)
    with scratch_namespace(db) as settings:
        assert settings.snapshot_interval == Settings.model_fields["snapshot_interval"].default
        live = open_sessions(settings, db)
        bulk = Sessions(
            env=database.library_env(db, settings, create_table=False),
            snapshot_interval=10**9,
        )
        try:
            seeding = time.monotonic()
            small_id = seed_session(bulk, live, 10)
            big_id = seed_session(bulk, live, big_turns)
            seeding = time.monotonic() - seeding
        finally:
            live.close()
            bulk.close()
        facts = snapshot_facts(db, settings, big_id)
        assert facts["snapshots"], "the 5,000-turn session has no snapshot"
        load = Loader(db, settings)
        big, small = interleave(repeat, lambda: load(big_id), lambda: load(small_id))
    t, b = Stat(big, "ms"), Stat(small, "ms")
    ratio = t.median / b.median
    messages = load.messages[big_id]
    per_thousand = t.median / (messages / 1000)
    load_ms = sorted(p[0] * 1000 for p in load.parts[big_id])[len(big) // 2]
    build_ms = sorted(p[1] * 1000 for p in load.parts[big_id])[len(big) // 2]
    return Figure(
        3,
        "load a 5,000-turn session + build its next request (cold cache)",
        [
            Row(
                "3",
                f"load + next request, 5,000 turns ({messages:,} messages)",
                t,
                b,
                ratio,
                "≤ 3x",
                ratio <= 3,
            ),
            Row(
                "3b",
                "absolute cost per 1,000 messages (5,000-turn session)",
                Stat([per_thousand], "ms"),
                None,
                None,
                "report",
                None,
            ),
        ],
        how=(
            f"Two sessions written by the domain's own commands (the figure-1 turn: 7 events)"
            f" and saved through the application every {SAVE_EVERY} turns; the last"
            f" {LIVE_TURNS} turns with the default snapshot interval"
            f" ({settings.snapshot_interval} events), so the application took"
            f" {facts['snapshots']} snapshots of the long one at save time (latest at version"
            f" {facts['latest_snapshot_version']} of {facts['version']},"
            f" {fmt((facts['latest_snapshot_bytes'] or 0) / 1e6)} MB). Each measurement builds a"
            " fresh `Sessions` (empty cache; its pool is opened outside the timing), then times"
            " `get_session` + `next_request`. Baseline: the same for a 10-turn session."
            f" Of the long session's median: load {fmt(load_ms)} ms, request {fmt(build_ms)} ms."
            f" Seeding took {fmt(seeding)} s."
        ),
        details={
            **facts,
            "messages": messages,
            "small_messages": load.messages[small_id],
            "split_ms_load_request": [
                (round(a * 1000, 2), round(r * 1000, 2)) for a, r in load.parts[big_id]
            ],
            "seeding_seconds": seeding,
        },
    )
