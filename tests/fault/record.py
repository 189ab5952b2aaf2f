"""The stored record of a fault run, read back raw, and the invariants it must keep.

Shared by the kill campaign (``campaign.py``, ``make chaos``), its short
version in ``make test`` and the worker soak (tests/benchmarks/soak_workers.py).
Everything here is judged from the raw events of the namespace and from the
tools' own external effects (marker lines in the sandbox files), never from
what the API says about itself.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
from eventsourcing.persistence import StoredEvent
from psycopg import sql

from tests.fault.cluster import worker_pid
from turnlog.application.database import Database
from turnlog.application.settings import Settings

EFFECTS_FILE = "effects.txt"
ENDINGS = {
    "TurnCompleted": "completed",
    "TurnFailed": "failed",
    "TurnAbandoned": "abandoned",
    "TurnInterrupted": "interrupted",
    "TurnCancelled": "cancelled",
}
RESULTS = ("ToolCallSucceeded", "ToolCallFailed")


@dataclass(frozen=True)
class Stored:
    """One stored event: where it is, what it is, when its writer made it, its fields."""

    position: int
    session_id: str
    version: int
    topic: str  # the short name: TurnClaimed, ToolCallStarted, …
    at: float  # the event's own timestamp (set by the process that wrote it), epoch seconds
    payload: dict[str, Any]


@dataclass
class Kill:
    """One SIGKILL: when, which role, which pid."""

    at: float  # epoch seconds
    role: str  # api | worker | projections
    pid: int
    restored_after: float | None = None  # seconds until the role served again


class Record:
    """The namespace's events, read incrementally and decoded by the application's mapper."""

    def __init__(self, settings: Settings, database: Database) -> None:
        from turnlog.interface.bootstrap import open_sessions

        self.settings = settings
        self.database = database
        self._app = open_sessions(settings, database)
        self.events: list[Stored] = []
        self._turns: dict[str, list[Stored]] = {}
        self.position = 0
        self._query = sql.SQL(
            "SELECT notification_id, originator_id, originator_version, topic, state"
            " FROM {}.sessions_events WHERE notification_id > %s ORDER BY notification_id"
        ).format(sql.Identifier(settings.schema_name))

    def refresh(self) -> Record:
        """Read the events stored since the last refresh."""
        with psycopg.connect(self.database.conninfo, autocommit=True) as conn:
            rows = conn.execute(self._query, (self.position,)).fetchall()
        for position, oid, version, topic, state in rows:
            event: Any = self._app.mapper.to_domain_event(
                StoredEvent(oid, version, topic, bytes(state))
            )
            payload = {k: v for k, v in vars(event).items() if not k.startswith("_")}
            short = topic.split(".")[2]
            stamp = event.timestamp.timestamp()
            stored = Stored(position, str(oid), version, short, stamp, payload)
            self.events.append(stored)
            if payload.get("turn_id"):
                self._turns.setdefault(str(payload["turn_id"]), []).append(stored)
            self.position = position
        return self

    def close(self) -> None:
        self._app.close()

    # ---------------------------------------------------------------- views

    def by_turn(self) -> dict[str, list[Stored]]:
        """Each turn's events, in log order (kept as events are read)."""
        return self._turns

    def session_ids(self) -> list[str]:
        return list(dict.fromkeys(e.session_id for e in self.events))


def final_state(events: Iterable[Stored]) -> str:
    """The state a turn's events leave it in (interrupted → resolved reads as running)."""
    state = "open"
    for e in events:
        state = ENDINGS.get(e.topic, state)
        if e.topic == "ToolCallResolved" and state == "interrupted":
            state = "open"
    return state


@dataclass
class Findings:
    """What the invariants found; every list empty means the record is sound."""

    lost: list[str] = field(default_factory=list)
    duplicate_effects: list[str] = field(default_factory=list)
    version_gaps: list[str] = field(default_factory=list)
    unjustified_interruptions: list[str] = field(default_factory=list)
    side_effects_rerun: list[str] = field(default_factory=list)
    silently_settled: list[str] = field(default_factory=list)
    effects_without_intent: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(vars(self).values())

    def counts(self) -> dict[str, int]:
        return {name: len(found) for name, found in vars(self).items()}


def check(
    record: Record,
    acknowledged: Iterable[str],
    killed_worker_pids: set[int] | None = None,
    markers: dict[str, str] | None = None,
) -> Findings:
    """Every invariant that holds at any moment of a run (not only at its end).

    ``acknowledged``: turn ids a client got a 202/200 for. ``killed_worker_pids``:
    when given, an interruption must name a call started by one of them.
    ``markers``: marker text → turn id, for the side-effecting calls' lines.
    """
    turns = record.by_turn()
    found = Findings()
    submitted = {t for t, ev in turns.items() if any(e.topic == "TurnSubmitted" for e in ev)}
    found.lost = sorted(set(acknowledged) - submitted)
    found.version_gaps = version_gaps(record.events)
    counts = effect_lines(record.settings.sandbox_root)
    found.duplicate_effects = sorted(line for line, n in counts.items() if n > 1)
    for turn_id, events in turns.items():
        _check_turn(turn_id, events, killed_worker_pids, found)
    if markers is not None:
        # Write-ahead intent: a line in a file means its call's start was stored first.
        started = {e.payload["turn_id"] for e in record.events if e.topic == "ToolCallStarted"}
        found.effects_without_intent = sorted(
            line for line in counts if markers.get(line) not in started
        )
    return found


def _check_turn(
    turn_id: str, events: list[Stored], killed: set[int] | None, found: Findings
) -> None:
    starts: dict[str, list[Stored]] = {}
    results: set[str] = set()
    resolved: set[str] = set()
    for e in events:
        call_id = str(e.payload.get("call_id", ""))
        if e.topic == "ToolCallStarted":
            starts.setdefault(call_id, []).append(e)
        elif e.topic in RESULTS:
            results.add(call_id)
        elif e.topic in ("ToolCallResolved",):
            resolved.add(call_id)
    for call_id, started in starts.items():
        if started[0].payload["effect"] == "side_effecting" and len(started) > 1:
            found.side_effects_rerun.append(f"{turn_id}/{call_id}: started {len(started)} times")
    interrupted: set[str] = set()
    for e in events:
        if e.topic == "TurnInterrupted":
            for call_id in e.payload["call_ids"]:
                interrupted.add(call_id)
                why = _unjustified(call_id, starts, results, killed)
                if why:
                    found.unjustified_interruptions.append(f"{turn_id}/{call_id}: {why}")
        if e.topic == "TurnAbandoned":
            interrupted.update(e.payload["call_ids"])
    for call_id in interrupted:
        # Unknown stays unknown until an operator says otherwise: no result may follow.
        if call_id in results:
            found.silently_settled.append(f"{turn_id}/{call_id}: a result after interruption")
    if final_state(events) == "completed":
        for call_id in interrupted - resolved:
            found.silently_settled.append(f"{turn_id}/{call_id}: completed while unknown")


def _unjustified(
    call_id: str, starts: dict[str, list[Stored]], results: set[str], killed: set[int] | None
) -> str:
    started = starts.get(call_id)
    if not started:
        return "never started"
    if started[-1].payload["effect"] != "side_effecting":
        return f"a {started[-1].payload['effect']} call (safe to repeat)"
    if call_id in results:
        return "its result was stored"
    if killed is not None and worker_pid(started[-1].payload["worker_id"]) not in killed:
        return "its worker was never killed"
    return ""


def version_gaps(events: Iterable[Stored]) -> list[str]:
    """Streams whose versions do not run 1..N."""
    versions: dict[str, list[int]] = {}
    for e in events:
        versions.setdefault(e.session_id, []).append(e.version)
    return [
        f"{sid}: versions {sorted(v)[:5]}… not 1..{len(v)}"
        for sid, v in versions.items()
        if sorted(v) != list(range(1, len(v) + 1))
    ]


def effect_lines(sandbox_root: Path) -> Counter[str]:
    """Every marker line the side-effecting calls wrote, with how often it was written."""
    counts: Counter[str] = Counter()
    for path in sandbox_root.glob(f"*/{EFFECTS_FILE}"):
        counts.update(line for line in path.read_text().splitlines() if line)
    return counts


def marker_written(sandbox_root: Path, session_id: str, marker: str) -> bool:
    path = sandbox_root / session_id / EFFECTS_FILE
    return path.exists() and marker in path.read_text().splitlines()


# ------------------------------------------------------------------ kills


def held_at(record: Record, pid: int, at: float) -> dict[str, list[str]]:
    """Turns a worker process held when it was killed → its unsafe calls then in flight.

    Judged from events written before ``at`` (an event's timestamp is taken
    by its writer before the commit, so a dead writer's events all precede
    its death).
    """
    held: dict[str, list[str]] = {}
    for turn_id, events in record.by_turn().items():
        before = [e for e in events if e.at <= at]
        claims = [e for e in before if e.topic == "TurnClaimed"]
        if not claims or worker_pid(claims[-1].payload["worker_id"]) != pid:
            continue
        # Ended, or let go to wait for an operator's approval (no one holds it then).
        if any(
            e.topic in ENDINGS or e.topic == "ToolCallProposed"
            for e in before
            if e.position > claims[-1].position
        ):
            continue
        settled = {str(e.payload["call_id"]) for e in before if e.topic in RESULTS}
        unsafe = [
            str(e.payload["call_id"])
            for e in before
            if e.topic == "ToolCallStarted"
            and e.position > claims[-1].position
            and e.payload["effect"] == "side_effecting"
            and str(e.payload["call_id"]) not in settled
        ]
        held[turn_id] = unsafe
    return held


def recovered(record: Record, held: dict[str, list[str]], at: float) -> dict[str, str]:
    """For each held turn: '' while nothing happened since ``at``, else what recovery did."""
    turns = record.by_turn()
    outcome: dict[str, str] = {}
    for turn_id, unsafe in held.items():
        after = [e for e in turns.get(turn_id, []) if e.at > at]
        first = next(
            (e for e in after if e.topic in ("TurnClaimed", "TurnInterrupted", "TurnCancelled")),
            None,
        )
        if first is None:
            outcome[turn_id] = ""
        elif first.topic == "TurnCancelled":
            # Cancelled while no one ran it: never with a side-effecting call in flight.
            outcome[turn_id] = f"WRONG: {first.topic}" if unsafe else "cancelled"
        elif unsafe:
            interrupted = first.topic == "TurnInterrupted" and set(unsafe) <= set(
                first.payload["call_ids"]
            )
            outcome[turn_id] = "interrupted" if interrupted else f"WRONG: {first.topic}"
        else:
            outcome[turn_id] = "resumed" if first.topic == "TurnClaimed" else "WRONG: interrupted"
    return outcome


def takeover_latencies(record: Record, kills: Iterable[Kill]) -> list[float]:
    """For each worker kill: seconds until each turn it held was claimed again or interrupted."""
    latencies = []
    turns = record.by_turn()
    for kill in kills:
        if kill.role != "worker":
            continue
        for turn_id in held_at(record, kill.pid, kill.at):
            after = [e for e in turns.get(turn_id, []) if e.at > kill.at]
            first = next((e for e in after if e.topic in ("TurnClaimed", "TurnInterrupted")), None)
            if first is not None:
                latencies.append(first.at - kill.at)
    return latencies


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def session_uuid(session_id: str) -> UUID:
    return UUID(session_id)
