"""The stored record of a fault run, read back raw, and the invariants it must keep.

Shared by the kill campaign (``campaign.py``, ``make chaos``), its short
version in ``make test`` and the worker soak (tests/benchmarks/soak_workers.py).
Everything here is judged from the raw events of the namespace and from the
tools' own external effects (marker lines in the sandbox files), never from
what the API says about itself.

With outcome probes on (``TURNLOG_PROBES``), recovery claims a turn whose
owner died inside a side-effecting call and asks the tool's probe before it
interrupts anything: ``probed`` names the tools whose probe is asked, and the
checks then expect a claim, a ``ToolCallProbed`` and its consequence — a
``ToolCallResolved`` by ``probe:<tool>`` (applied / not_applied) or a
``TurnInterrupted`` after an ``unknown`` answer — where they expected an
interruption before.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
from eventsourcing.persistence import StoredEvent
from psycopg import sql

from tests.fault.cluster import worker_pid
from turnlog.application.settings import Settings
from turnlog.application.store import logorder
from turnlog.application.store.database import Database

EFFECTS_FILE = "effects.txt"
ENDINGS = {
    "TurnCompleted": "completed",
    "TurnFailed": "failed",
    "TurnAbandoned": "abandoned",
    "TurnInterrupted": "interrupted",
    "TurnCancelled": "cancelled",
}
RESULTS = ("ToolCallSucceeded", "ToolCallFailed")
SETTLED = (*RESULTS, "ToolCallResolved")  # a call's outcome is on record
PROBE_ACTOR = "probe:"  # ToolCallResolved's actor when a probe settled the call
SETTLES = {"applied": "succeeded", "not_applied": "failed"}  # probe answer → resolved outcome


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
    """The namespace's events, read incrementally and decoded by the application's mapper.

    Writers insert without a table lock, so positions do not commit in order:
    a reader past position 102 could later see 101 appear. Each refresh reads
    every row past the last place (``application.store.logorder``: transaction id,
    position) below which the log is final (the commit horizon, taken in the
    same statement), and keeps the rows it has not seen; rows above the
    horizon are read again by the next refresh and skipped by id.
    """

    def __init__(self, settings: Settings, database: Database) -> None:
        from turnlog.interface.bootstrap import open_sessions

        self.settings = settings
        self.database = database
        self._app = open_sessions(settings, database)
        self.events: list[Stored] = []
        self._turns: dict[str, list[Stored]] = {}
        self._seen: set[int] = set()
        self._final = logorder.Place.start()  # every row up to here is read and final
        self.position = 0  # the highest position read
        table = logorder.table(settings.schema_name, "sessions_events")
        self._places = sql.SQL(
            "SELECT notification_id, {xact}::text, {below}"
            " FROM {table} WHERE {past} ORDER BY {order}"
        ).format(
            xact=logorder.XACT,
            below=logorder.BELOW_HORIZON,
            table=table,
            past=logorder.PAST,
            order=logorder.LOG_ORDER,
        )
        self._rows = sql.SQL(
            "SELECT notification_id, originator_id, originator_version, topic, state"
            " FROM {table} WHERE notification_id = ANY(%s) ORDER BY {order}"
        ).format(table=table, order=logorder.LOG_ORDER)

    def refresh(self) -> Record:
        """Read the events stored since the last refresh (also those that committed late)."""
        with psycopg.connect(self.database.conninfo, autocommit=True) as conn:
            places = conn.execute(self._places, self._final.params()).fetchall()
            new = [position for position, _, _ in places if position not in self._seen]
            rows = conn.execute(self._rows, (new,)).fetchall() if new else []
        for position, xact, final in places:
            if not final:
                break
            self._final = logorder.Place(int(xact), position)
        for position, oid, version, topic, state in rows:
            self._seen.add(position)
            event: Any = self._app.mapper.to_domain_event(
                StoredEvent(oid, version, topic, bytes(state))
            )
            payload = {k: v for k, v in vars(event).items() if not k.startswith("_")}
            short = topic.split(".")[2]
            stamp = event.timestamp.timestamp()
            stored = Stored(position, str(oid), version, short, stamp, payload)
            self.events.append(stored)
            if payload.get("turn_id"):
                turn = self._turns.setdefault(str(payload["turn_id"]), [])
                turn.append(stored)
                if len(turn) > 1 and turn[-2].version > version:
                    turn.sort(key=lambda e: e.version)  # a stream's order is its versions'
            self.position = max(self.position, position)
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
    # A call whose outcome is on record as succeeded, and whose line is not in its file.
    effects_missing: list[str] = field(default_factory=list)
    # With probes on: an interruption of a probed tool's call not preceded by an
    # ``unknown`` answer; a probe of a call whose owner was not killed (or that was not in
    # flight); a ToolCallResolved by ``probe:<tool>`` that its probe's answer does not back.
    interrupted_without_unknown_probe: list[str] = field(default_factory=list)
    unjustified_probes: list[str] = field(default_factory=list)
    probe_resolutions_unbacked: list[str] = field(default_factory=list)

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
    probed: Collection[str] = (),
) -> Findings:
    """Every invariant that holds at any moment of a run (not only at its end).

    ``acknowledged``: turn ids a client got a 202/200 for. ``killed_worker_pids``:
    when given, an interruption must name a call started by one of them.
    ``markers``: marker text → turn id, for the side-effecting calls' lines.
    ``probed``: the tools whose probe recovery asks (probes on); an interruption
    of one of their calls must then follow an ``unknown`` answer.
    """
    turns = record.by_turn()
    found = Findings()
    submitted = {t for t, ev in turns.items() if any(e.topic == "TurnSubmitted" for e in ev)}
    found.lost = sorted(set(acknowledged) - submitted)
    found.version_gaps = version_gaps(record.events)
    counts = effect_lines(record.settings.sandbox_root)
    found.duplicate_effects = sorted(line for line, n in counts.items() if n > 1)
    for turn_id, events in turns.items():
        _check_turn(turn_id, events, killed_worker_pids, found, probed)
    if markers is not None:
        # Write-ahead intent: a line in a file means its call's start was stored first.
        started = {e.payload["turn_id"] for e in record.events if e.topic == "ToolCallStarted"}
        found.effects_without_intent = sorted(
            line for line in counts if markers.get(line) not in started
        )
        _check_effects(turns, markers, counts, found)
    return found


def call_names(events: Iterable[Stored]) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each call of a turn → (tool name, arguments), from the model's replies."""
    return {
        str(c["call_id"]): (str(c["name"]), dict(c.get("arguments") or {}))
        for e in events
        if e.topic == "ModelReplied"
        for c in e.payload["tool_calls"]
    }


def call_outcome(events: Iterable[Stored], call_id: str) -> str:
    """What the record says of a call: never started, unknown, succeeded or failed."""
    outcome = "never started"
    for e in events:
        if str(e.payload.get("call_id", "")) != call_id:
            continue
        if e.topic == "ToolCallStarted":
            outcome = "unknown"
        elif e.topic == "ToolCallSucceeded":
            outcome = "succeeded"
        elif e.topic == "ToolCallFailed":
            outcome = "failed"
        elif e.topic == "ToolCallResolved":
            outcome = str(e.payload["outcome"])
    return outcome


def _check_effects(
    turns: dict[str, list[Stored]],
    markers: dict[str, str],
    counts: Counter[str],
    found: Findings,
) -> None:
    """Each marker's lines counted against what the record says of its call.

    Succeeded (by the tool, an operator or a probe) → exactly one line; failed
    (a not_applied probe too) or never started → none; still unknown (the turn
    abandoned) → at most one. A line more than the record accounts for is a
    duplicate side effect; a succeeded call without its line is missing.
    """
    for marker, turn_id in markers.items():
        events = turns.get(turn_id, [])
        calls = [c for c, (_, args) in call_names(events).items() if args.get("text") == marker]
        outcomes = [call_outcome(events, c) for c in calls]
        lines = counts.get(marker, 0)
        at_least = outcomes.count("succeeded")
        at_most = at_least + outcomes.count("unknown")
        if at_most < lines <= 1:  # more than one line is already a duplicate (above)
            found.duplicate_effects.append(f"{marker}: {lines} line(s); on record: {outcomes}")
        if lines < at_least:
            found.effects_missing.append(f"{marker}: {lines} line(s); on record: {outcomes}")


def _check_turn(
    turn_id: str,
    events: list[Stored],
    killed: set[int] | None,
    found: Findings,
    probed: Collection[str] = (),
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
    if any(e.topic in ("ToolCallProbed", "ToolCallResolved") for e in events) or probed:
        _check_probes(turn_id, events, killed, found, probed)


def _check_probes(
    turn_id: str,
    events: list[Stored],
    killed: set[int] | None,
    found: Findings,
    probed: Collection[str],
) -> None:
    """Probe runs and what followed from them, in the turn's order.

    A probe runs only on a side-effecting call in flight (started, no result
    for that attempt) whose owner was killed; a resolution by ``probe:<tool>``
    is backed by that tool's latest probe answer for the attempt (applied →
    succeeded, not_applied → failed) and no result of the attempt is stored;
    an interruption of a probed tool's call follows an ``unknown`` answer.
    """
    names = call_names(events)
    latest_start: dict[str, Stored] = {}
    answer: dict[str, str] = {}  # call → its latest probe's answer since its latest start
    result_attempts = {
        (str(e.payload["call_id"]), int(e.payload["attempt"])) for e in events if e.topic in RESULTS
    }
    settled: set[str] = set()  # calls with a result (or resolution) since their latest start
    for e in events:
        call_id = str(e.payload.get("call_id", ""))
        where = f"{turn_id}/{call_id}"
        if e.topic == "ToolCallStarted":
            latest_start[call_id] = e
            answer.pop(call_id, None)
            settled.discard(call_id)
        elif e.topic in SETTLED:
            settled.add(call_id)
        if e.topic == "ToolCallProbed":
            answer[call_id] = str(e.payload["answer"])
            start = latest_start.get(call_id)
            if start is None:
                found.unjustified_probes.append(f"{where}: probed, never started")
            elif start.payload["effect"] != "side_effecting":
                found.unjustified_probes.append(f"{where}: probed a {start.payload['effect']} call")
            elif call_id in settled:
                found.unjustified_probes.append(f"{where}: probed after its outcome was stored")
            elif killed is not None and worker_pid(start.payload["worker_id"]) not in killed:
                found.unjustified_probes.append(f"{where}: probed, its worker was never killed")
        elif e.topic == "ToolCallResolved" and str(e.payload["actor"]).startswith(PROBE_ACTOR):
            expected = SETTLES.get(answer.get(call_id, ""))
            start = latest_start.get(call_id)
            attempt = int(start.payload["attempt"]) if start else 0
            if e.payload["actor"] != PROBE_ACTOR + names.get(call_id, ("?", {}))[0]:
                found.probe_resolutions_unbacked.append(f"{where}: by {e.payload['actor']}")
            elif e.payload["outcome"] != expected:
                found.probe_resolutions_unbacked.append(
                    f"{where}: {e.payload['outcome']} after the answer {answer.get(call_id)}"
                )
            elif (call_id, attempt) in result_attempts:
                found.probe_resolutions_unbacked.append(f"{where}: its attempt has a result too")
        elif e.topic == "TurnInterrupted" and probed:
            for interrupted in e.payload["call_ids"]:
                if names.get(interrupted, ("", {}))[0] in probed and (
                    answer.get(interrupted) != "unknown"
                ):
                    found.interrupted_without_unknown_probe.append(
                        f"{turn_id}/{interrupted}: probe answer {answer.get(interrupted, 'none')}"
                    )


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
    its death). A side-effecting call is in flight from its start until its
    result or resolution — also across a claim: with probes on, recovery
    claims the turn before it probes the call a dead owner left.
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
        in_flight: dict[str, None] = {}
        for e in before:
            call_id = str(e.payload.get("call_id", ""))
            if e.topic == "ToolCallStarted" and e.payload["effect"] == "side_effecting":
                in_flight[call_id] = None
            elif e.topic in SETTLED:
                in_flight.pop(call_id, None)
        held[turn_id] = list(in_flight)
    return held


def recovered(
    record: Record, held: dict[str, list[str]], at: float, probed: Collection[str] = ()
) -> dict[str, str]:
    """For each held turn: '' while nothing happened since ``at``, else what recovery did.

    resumed | interrupted | cancelled | probed: <answer> (a probed tool's call
    in flight: claimed, probed, resolved or, after ``unknown``, interrupted) |
    WRONG: … (anything else).
    """
    turns = record.by_turn()
    outcome: dict[str, str] = {}
    for turn_id, unsafe in held.items():
        events = turns.get(turn_id, [])
        after = [e for e in events if e.at > at]
        first = next(
            (e for e in after if e.topic in ("TurnClaimed", "TurnInterrupted", "TurnCancelled")),
            None,
        )
        names = call_names(events)
        to_probe = bool(unsafe) and all(names.get(c, ("", {}))[0] in probed for c in unsafe)
        if first is None:
            outcome[turn_id] = ""
        elif first.topic == "TurnCancelled":
            # Cancelled while no one ran it: never with a side-effecting call in flight.
            outcome[turn_id] = f"WRONG: {first.topic}" if unsafe else "cancelled"
        elif to_probe:
            if first.topic == "TurnInterrupted":
                outcome[turn_id] = "WRONG: interrupted without a probe"
            else:
                outcome[turn_id] = _probed(after[after.index(first) :], unsafe)
        elif unsafe:
            interrupted = first.topic == "TurnInterrupted" and set(unsafe) <= set(
                first.payload["call_ids"]
            )
            outcome[turn_id] = "interrupted" if interrupted else f"WRONG: {first.topic}"
        else:
            outcome[turn_id] = "resumed" if first.topic == "TurnClaimed" else "WRONG: interrupted"
    return outcome


def _probed(after_claim: list[Stored], unsafe: list[str]) -> str:
    """What followed recovery's claim of a turn with probed calls in flight ('' not yet)."""
    answers: dict[str, str] = {}
    for e in after_claim:
        call_id = str(e.payload.get("call_id", ""))
        if e.topic == "ToolCallProbed" and call_id in unsafe and call_id not in answers:
            answers[call_id] = str(e.payload["answer"])
        elif e.topic == "TurnInterrupted":
            if "unknown" not in answers.values():
                return "WRONG: interrupted without an unknown probe answer"
            if not set(unsafe) - set(answers) <= set(e.payload["call_ids"]):
                return "WRONG: interrupted without every call in flight"
            return "probed: unknown"
    if set(answers) != set(unsafe):
        return ""  # claimed, the probe not recorded yet
    if "unknown" in answers.values():
        return ""  # its interruption is stored in the same save: not read yet
    return "probed: " + ", ".join(sorted(set(answers.values())))


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
