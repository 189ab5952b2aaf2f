"""Figure 3: loading a long session and building its next request, in a cold process cache.

A session of 5,000 turns (the figure-1 turn: one tool call each) is written
by the domain's own commands and saved through the application in chunks,
so the application takes its snapshots at save time with the default
interval, exactly as a live session would get them. Each measurement opens a
fresh ``Sessions`` (nothing cached), then times ``get_session`` +
``request_for``; the baseline is the same for a 10-turn session. Row 3 is
for sessions with a context-window policy (``context.max_turns`` = 20, the
summaries recorded as the executor records them); row 3b the same without
a policy, where the request carries every turn.
"""

from __future__ import annotations

import json
import time
from functools import partial
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql

from tests.benchmarks.bench_throughput import Config
from tests.benchmarks.suite import Figure, Row, Stat, fmt, interleave, scratch_namespace
from turnlog.application.said import collector_paused
from turnlog.application.sessions import Sessions
from turnlog.application.settings import Settings
from turnlog.application.store import database, said_turns
from turnlog.application.store.database import Database
from turnlog.domain.session import Session
from turnlog.domain.turns import Effect
from turnlog.interface.bootstrap import open_sessions

WORKER = "bench-worker"
SAVE_EVERY = 25  # turns per save while seeding
LIVE_TURNS = 100  # the last turns are saved with the default snapshot interval
POLICY_TURNS = 20  # context.max_turns of the sessions row 3 measures
SUMMARY = (
    "Summary of the conversation so far: the user asked the echo tool to return"
    " 'benchmark N' for each turn; every call succeeded and its result was reported."
)


def compact_if_due(session: Session, turn_id: str, claim: int) -> None:
    """The summary the executor records before a request that would break the session's
    ``context.max_turns`` (the rule of ``domain.compaction.turns_to_cover``: the oldest
    turns after the previous summary are covered so that ``(max_turns - 1) // 2`` remain)."""
    limit = session.context_max_turns
    if not limit or len(session.finished) - session.compacted_turns + 1 <= limit:
        return
    turns = len(session.finished) - (limit - 1) // 2
    produced_by = {"provider": "fixture", "model": "fixture-1", "usage": {}}
    session.compact_context(turn_id, claim, SUMMARY, turns, produced_by)


def tool_turn(session: Session, index: int) -> None:
    """The events the agent loop records for ``/tool echo`` with the fixture provider."""
    message = f'/tool echo {{"text": "benchmark {index}"}}'
    turn, _ = session.submit_turn(message)
    tid = turn.turn_id
    claim = session.claim_turn(tid, WORKER)
    compact_if_due(session, tid, claim)
    call_id = f"call_{index}"
    call = {"call_id": call_id, "name": "echo", "arguments": {"text": f"benchmark {index}"}}
    session.record_model_reply(tid, claim, "", [call], {"input_messages": 4 * index + 1})
    attempt = session.start_tool_call(tid, claim, call_id, WORKER, Effect.READ_ONLY)
    session.record_tool_succeeded(tid, claim, call_id, attempt, {"text": f"benchmark {index}"})
    reply = f'Tool echo returned: {{"text": "benchmark {index}"}}'
    session.record_model_reply(tid, claim, reply, [], {"input_messages": 4 * index + 3})
    session.complete_turn(tid, claim, reply)


def seed_session(bulk: Sessions, live: Sessions, turns: int, max_turns: int | None = None) -> UUID:
    """A session of ``turns`` turns; its last ``LIVE_TURNS`` saved by ``live``.

    ``max_turns``: the session's context-window policy (its summaries are
    recorded as the executor records them).

    ``bulk`` takes no snapshots (taking one reloads the session from the
    store, which makes seeding quadratic); ``live`` has the default interval
    and saves the last turns every ``SAVE_EVERY`` turns, so the latest
    snapshots are taken at save time, where a live session's would be.
    """
    session = Session.start(
        title=f"{turns} turns", tools=["echo"], model="fixture-1", context_max_turns=max_turns
    )
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

    def warm_up(self, *session_ids: UUID) -> None:
        """One unmeasured load of each: the server's buffers, not the process, are warm."""
        for session_id in session_ids:
            self(session_id)
            self.parts[session_id].pop()

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


class RawResume:
    """The baseline of row 3b: raw psycopg reading and decoding what a resume reads.

    On a connection opened outside the timing, as ``Loader``'s pool is: the
    session's latest snapshot row and the events after it, the chunks of
    finished-turn entries beside it, and the stored messages of its finished
    turns (one aggregated row, as ``said_turns.read`` asks); each JSON value
    decoded with ``json.loads`` into plain lists and dicts, with the garbage
    collector paused as turnlog pauses it. No objects are built: this is the
    reading and decoding any resume from these tables pays.
    """

    def __init__(self, db: Database, settings: Settings) -> None:
        schema = settings.schema_name
        self.conninfo = db.conninfo
        self.snapshot = sql.SQL(
            "SELECT originator_version, state FROM {} WHERE originator_id = %s"
            " ORDER BY originator_version DESC LIMIT 1"
        ).format(sql.Identifier(schema, "sessions_snapshots"))
        self.events = sql.SQL(
            "SELECT topic, state FROM {} WHERE originator_id = %s AND originator_version > %s"
            " ORDER BY originator_version"
        ).format(sql.Identifier(schema, "sessions_events"))
        self.chunks = sql.SQL(
            "SELECT entries FROM {} WHERE session_id = %s ORDER BY first_n"
        ).format(sql.Identifier(schema, "sessions_finished_chunks"))
        self.said = sql.SQL(
            "SELECT '[' || string_agg(said, ',' ORDER BY first_version, ordinal) || ']'"
            " FROM {} WHERE session_id = %s"
        ).format(said_turns.table(schema))

    def __call__(self, session_id: UUID) -> float:
        with psycopg.connect(self.conninfo, autocommit=True) as conn, collector_paused():
            started = time.perf_counter()
            row = conn.execute(self.snapshot, (session_id,)).fetchone()
            version = row[0] if row else 0
            decoded: list[Any] = [json.loads(bytes(row[1])) if row else None]
            for _topic, state in conn.execute(self.events, (session_id, version)):
                decoded.append(json.loads(bytes(state)))
            for (entries,) in conn.execute(self.chunks, (session_id,)):
                decoded.append(json.loads(bytes(entries)))
            said = conn.execute(self.said, (session_id,)).fetchone()
            decoded.append(json.loads(said[0]) if said and said[0] else [])
            return (time.perf_counter() - started) * 1000


def figure_3(db: Database, cfg: Config) -> Figure:
    big_turns = 5000
    # A load with a policy takes tens of milliseconds: many repeats steady its median.
    # Without one, the 5,000-turn request takes seconds; its row is a report.
    repeats = {
        "policy": max(cfg.repeat, 11 if cfg.quick else 21),
        "none": max(cfg.repeat, 3 if cfg.quick else 5),
    }
    with scratch_namespace(db) as settings:
        assert settings.snapshot_interval == Settings.model_fields["snapshot_interval"].default
        live = open_sessions(settings, db)
        bulk = Sessions(
            env=database.library_env(db, settings, create_table=False),
            snapshot_interval=10**9,
        )
        try:
            seeding = time.monotonic()
            ids = {
                "policy": (
                    seed_session(bulk, live, big_turns, POLICY_TURNS),
                    seed_session(bulk, live, 10, POLICY_TURNS),
                ),
                "none": (seed_session(bulk, live, big_turns), seed_session(bulk, live, 10)),
            }
            seeding = time.monotonic() - seeding
        finally:
            live.close()
            bulk.close()
        facts = {kind: snapshot_facts(db, settings, big) for kind, (big, _) in ids.items()}
        assert all(f["snapshots"] for f in facts.values()), "a 5,000-turn session has no snapshot"
        load = Loader(db, settings)
        stats = {}
        for kind, (big_id, small_id) in ids.items():
            load.warm_up(big_id, small_id)
            big, small = interleave(repeats[kind], partial(load, big_id), partial(load, small_id))
            stats[kind] = (Stat(big, "ms"), Stat(small, "ms"))
        raw = RawResume(db, settings)
        big_none = ids["none"][0]
        raw(big_none)  # unmeasured, as the loads' warm-up
        ours, theirs = interleave(repeats["none"], partial(load, big_none), partial(raw, big_none))
        stats["raw"] = (Stat(ours, "ms"), Stat(theirs, "ms"))
    return _figure_3(ids, stats, load, facts, settings, seeding)


def _figure_3(
    ids: dict[str, tuple[UUID, UUID]],
    stats: dict[str, tuple[Stat, Stat]],
    load: Loader,
    facts: dict[str, dict[str, Any]],
    settings: Settings,
    seeding: float,
) -> Figure:
    (t, b), (tn, bn), (tr, br) = stats["policy"], stats["none"], stats["raw"]
    ratio, ratio_none, ratio_raw = t.median / b.median, tn.median / bn.median, tr.median / br.median
    big_policy, big_none = ids["policy"][0], ids["none"][0]
    messages, messages_none = load.messages[big_policy], load.messages[big_none]
    per_thousand = tn.median / (messages_none / 1000)

    def split(session_id: UUID) -> str:
        parts = load.parts[session_id]
        loads = sorted(p[0] * 1000 for p in parts)[len(parts) // 2]
        builds = sorted(p[1] * 1000 for p in parts)[len(parts) // 2]
        return f"load {fmt(loads)} ms, request {fmt(builds)} ms"

    return Figure(
        3,
        "load a 5,000-turn session + build its next request (cold cache)",
        [
            Row(
                "3",
                f"load + next request, 5,000 turns vs 10, context.max_turns = {POLICY_TURNS}"
                f" ({messages} messages)",
                t,
                b,
                ratio,
                "≤ 3x",
                ratio <= 3,
            ),
            Row(
                "3b",
                f"resume without a context policy ({messages_none:,} messages), against raw"
                " psycopg reading and decoding the same rows",
                tr,
                br,
                ratio_raw,
                "≤ 2x",
                ratio_raw <= 2,
            ),
            Row(
                "3e",
                f"the same, 5,000 turns vs 10 (without a policy: {messages_none:,} messages vs 40)",
                tn,
                bn,
                ratio_none,
                "report",
                None,
            ),
            Row(
                "3c",
                "absolute cost per 1,000 messages (5,000 turns, no policy)",
                Stat([per_thousand], "ms"),
                None,
                None,
                "report",
                None,
            ),
        ],
        how=(
            f"Four sessions written by the domain's own commands (the figure-1 turn: 7 events)"
            f" and saved through the application every {SAVE_EVERY} turns; the last"
            f" {LIVE_TURNS} turns with the default snapshot interval"
            f" ({settings.snapshot_interval} events), so the snapshots are taken (and the"
            " superseded ones pruned) at save time: 5,000 and 10 turns with"
            f" `context.max_turns = {POLICY_TURNS}` (a `ContextCompacted` recorded after the"
            " claim whenever the request would carry more turns, as the executor does: about"
            f" one every {POLICY_TURNS // 2 + 1} turns), and 5,000 and 10 turns without a policy."
            f" The long sessions keep {facts['policy']['snapshots']} and"
            f" {facts['none']['snapshots']} snapshot rows (latest"
            f" {fmt((facts['policy']['latest_snapshot_bytes'] or 0) / 1e3)} kB and"
            f" {fmt((facts['none']['latest_snapshot_bytes'] or 0) / 1e3)} kB). Each measurement"
            " builds a fresh `Sessions` (empty cache; its pool is opened outside the timing),"
            " then times `get_session` + `request_for` (the earlier turns read from the stream"
            " by version range), after one unmeasured load of each session. Baseline: the same"
            " for the 10-turn session of the same kind; runs alternate. Row 3b times the same"
            " resume of the long session without a policy against raw psycopg on a connection"
            " opened outside the timing: its latest snapshot row and the events after it, the"
            " chunks of finished-turn entries, and its turns' stored messages (one aggregated"
            " row), each decoded by `json.loads` into plain values; runs alternate."
            f" Of the long sessions' medians: with the policy {split(big_policy)}; without"
            f" {split(big_none)}. Seeding took {fmt(seeding)} s."
        ),
        details={
            "snapshots": facts,
            "messages": {"policy": messages, "none": messages_none},
            "small_messages": {k: load.messages[v[1]] for k, v in ids.items()},
            "split_ms_load_request": {
                kind: [(round(a * 1000, 2), round(r * 1000, 2)) for a, r in load.parts[v[0]]]
                for kind, v in ids.items()
            },
            "seeding_seconds": seeding,
        },
    )
