"""Auditing the stored record: raw events, and proof that a stream is whole.

``stream`` and ``log_page`` show events exactly as stored (position,
version, topic, payload), with the time each was recorded decoded by the
Sessions application's own mapper. ``verify_stream`` checks that a session's
stream is whole and that everything derived from it agrees:

1. versions run 1..N without gaps;
2. every event decodes with the current code;
3. the aggregate replays from the events alone (and loads the same way
   through the repository, with snapshots);
4. each read model's rows for the session equal the fold of the stream up
   to that read model's position, and, once it has caught up, agree with the
   replayed aggregate's own state;
5. each event's stored hash is recomputed from its bytes and the previous
   event's hash (``application.store.chain``); the first broken link is named.
   A stream stored before the chain (no hash at all) is a problem, since
   nothing proves it whole, unless the caller accepts unchained streams
   (then it is reported not compared) until ``turnlog audit --chain-existing``
   has hashed it;
6. each stored snapshot's seal holds and the session it restores equals the
   replay of the events up to its version (``projections.snapshot_audit``).

What each read model was compared over is reported (``compared``), and
what could not be (``not_compared``): a read model that has processed none
of the stream's events, or only part of it, proves nothing about the rest.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from eventsourcing.persistence import StoredEvent, Tracking
from psycopg import sql

from turnlog.application.errors import SessionNotFound
from turnlog.application.store import chain, logorder
from turnlog.application.store.logorder import LogTracking, Place, place_of_tracking
from turnlog.domain.session import Session, retaining
from turnlog.projections import snapshot_audit
from turnlog.projections.catalog import ReadModel, read_models
from turnlog.projections.log import EventLog
from turnlog.projections.rebuild import compare
from turnlog.projections.rows import Row, storable


@dataclass(frozen=True)
class StoredRecord:
    """One stored event: where it is, what it is, and its payload as stored."""

    position: int
    session_id: UUID
    version: int
    topic: str
    recorded_at: datetime | None  # None when the event does not decode
    payload: Any
    event: Any = field(default=None, repr=False, compare=False)
    error: str = ""  # why it does not decode
    xact: int = 0  # the inserting transaction (0: stored before they were recorded)

    def as_json(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "session_id": str(self.session_id),
            "version": self.version,
            "topic": self.topic,
            "recorded_at": self.recorded_at.isoformat() if self.recorded_at else None,
            "payload": self.payload,
            **({"error": self.error} if self.error else {}),
        }


@dataclass
class StreamAudit:
    """What ``verify_stream`` found: problems (empty when whole) and notes."""

    session_id: UUID
    events: int
    last_position: int
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    compared: list[str] = field(default_factory=list)  # what was checked, one line each
    not_compared: list[str] = field(default_factory=list)  # what could not be

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def complete(self) -> bool:
        """Every read model was compared over the whole stream."""
        return not self.not_compared


def stream(events: EventLog, session_id: UUID) -> list[StoredRecord]:
    """Every stored event of one session, in version order."""
    return _select(
        events, sql.SQL("WHERE originator_id = %s ORDER BY originator_version"), [session_id]
    )


def log_page(events: EventLog, after: int = 0, limit: int = 100) -> list[StoredRecord]:
    """Up to ``limit`` events of the whole log after the event at position ``after``.

    In the log's order and below the commit horizon (``application.store.logorder``):
    pass the last record's position as ``after`` for the next page, and no
    event is skipped or repeated. ``after`` must be 0 or the position of an
    event of this log (``InvalidPosition`` otherwise).
    """
    place = events.place_of(after)
    return _select(
        events,
        sql.SQL("WHERE {} AND {} ORDER BY {} LIMIT %s").format(
            logorder.PAST, logorder.BELOW_HORIZON, logorder.LOG_ORDER
        ),
        [*place.params(), limit],
    )


def _select(events: EventLog, where: sql.Composable, params: list[Any]) -> list[StoredRecord]:
    statement = sql.SQL(
        "SELECT notification_id, originator_id, originator_version, topic, state,"
        " {}::text AS xact FROM {}.{} {}"
    ).format(
        logorder.XACT, sql.Identifier(events.schema), sql.Identifier(events.events_table), where
    )
    with events.datastore.get_connection() as conn:
        rows = conn.execute(statement, params).fetchall()
    return [_record(events, row) for row in rows]


def _record(events: EventLog, row: Any) -> StoredRecord:
    state = bytes(row["state"])
    stored = StoredEvent(row["originator_id"], row["originator_version"], row["topic"], state)
    try:
        event, error = events.sessions.mapper.to_domain_event(stored), ""
    except Exception as exc:
        event, error = None, f"{type(exc).__name__}: {exc}"
    try:
        payload: Any = json.loads(state)
    except ValueError:
        payload = state.decode("utf-8", "replace")
    return StoredRecord(
        position=row["notification_id"],
        session_id=row["originator_id"],
        version=row["originator_version"],
        topic=row["topic"],
        recorded_at=getattr(event, "timestamp", None),
        payload=payload,
        event=event,
        error=error,
        xact=int(row["xact"]),
    )


def verify_stream(
    events: EventLog, session_id: UUID, accept_unchained: bool = False
) -> StreamAudit:
    """Check one session's stream and what is derived from it; see the module docstring."""
    records = stream(events, session_id)
    if not records:
        raise SessionNotFound(f"session {session_id} has no stored events")
    audit = StreamAudit(session_id, len(records), max(r.position for r in records))
    _check_versions(records, audit)
    _check_chain(events, session_id, audit, accept_unchained)
    for r in records:
        if r.error:
            audit.problems.append(
                f"event version {r.version} (position {r.position}, {r.topic}) "
                f"does not decode: {r.error}"
            )
    session = _replay(records, audit) if not any(r.error for r in records) else None
    if session is not None:
        _check_repository(events, session, audit)
    snapshot_audit.check_snapshots(events, records, audit)
    decoded: list[tuple[Any, Tracking]] = [
        (r.event, LogTracking(events.application_name, r.position, r.xact))
        for r in records
        if r.event
    ]
    for model in read_models():
        _check_read_model(events, model, session_id, decoded, session, audit)
    return audit


def _check_versions(records: list[StoredRecord], audit: StreamAudit) -> None:
    versions = [r.version for r in records]
    missing = sorted(set(range(1, max(versions) + 1)) - set(versions))
    if missing:
        audit.problems.append(
            f"version gap: version(s) {', '.join(map(str, missing))} missing "
            f"from a stream of versions 1..{max(versions)}"
        )


def _check_chain(
    events: EventLog, session_id: UUID, audit: StreamAudit, accept_unchained: bool
) -> None:
    with events.datastore.get_connection() as conn:
        links = chain.read_links(conn, events.schema, events.events_table, session_id)
    found = chain.check(links)
    audit.problems.extend(found.broken)
    if found.unchained and not found.broken:
        unchained = (
            f"hash chain: {len(found.unchained)} of {len(links)} events unchained (stored"
            f" before events were chained, from version {found.unchained[0]}): nothing proves"
            " them unchanged; run `turnlog audit --chain-existing` once to chain them"
        )
        if accept_unchained:
            audit.not_compared.append(unchained)
        else:
            audit.problems.append(f"{unchained}, or pass --accept-unchained")
    if found.chained:
        audit.compared.append(
            f"hash chain: {found.chained} of {len(links)} events recomputed and linked"
        )


def head(events: EventLog, session_id: UUID) -> tuple[int, bytes | None, list[str]]:
    """The stream's last version, its hash (None: unchained) and its broken links.

    The whole chain is recomputed: a head is worth keeping only when every
    link up to it holds.
    """
    with events.datastore.get_connection() as conn:
        links = chain.read_links(conn, events.schema, events.events_table, session_id)
    if not links:
        raise SessionNotFound(f"session {session_id} has no stored events")
    return links[-1].version, links[-1].hash, chain.check(links).broken


def chain_existing(
    events: EventLog, progress: Callable[[chain.Chained, int, int], None]
) -> list[chain.Chained]:
    """Hash every unchained stream from its first event (``application.store.chain``)."""
    return chain.chain_existing(
        events.datastore, events.schema, events.events_table, progress=progress
    )


def _replay(records: list[StoredRecord], audit: StreamAudit) -> Session | None:
    aggregate: Any = None
    for r in records:
        try:
            aggregate = r.event.mutate(aggregate)
            if isinstance(aggregate, Session) and not aggregate.retains_finished:
                retaining(aggregate)  # every turn kept: the audit compares them all
        except Exception as exc:
            audit.problems.append(
                f"replay fails at version {r.version} ({r.topic}): {type(exc).__name__}: {exc}"
            )
            return None
    if not isinstance(aggregate, Session):
        audit.problems.append(f"the stream replays to {type(aggregate).__name__}, not a Session")
        return None
    return aggregate


def _check_repository(events: EventLog, session: Session, audit: StreamAudit) -> None:
    try:
        loaded = events.sessions.get_session(session.id)
    except Exception as exc:
        audit.problems.append(
            f"the repository cannot load the session: {type(exc).__name__}: {exc}"
        )
        return
    if loaded.version != session.version:
        audit.problems.append(
            f"the repository (with snapshots) loads version {loaded.version}, "
            f"the events replay to version {session.version}"
        )


def _check_read_model(
    events: EventLog,
    model: ReadModel,
    session_id: UUID,
    decoded: list[tuple[Any, Tracking]],
    session: Session | None,
    audit: StreamAudit,
) -> None:
    view = model.postgres_view(events.datastore)
    place, live = view.snapshot(events.application_name, {"session_id": session_id})
    position = place.position
    memory = model.memory_view()
    projection = model.projection(memory)
    for event, tracking in decoded:
        if place_of_tracking(tracking) <= place:
            projection.process_event(event, tracking)
    for difference in compare(model.table, live, memory.rows.all()):
        audit.problems.append(f"read model {model.name}: {difference.describe()}")
    folded = sum(1 for _, tracking in decoded if place_of_tracking(tracking) <= place)
    last = max((place_of_tracking(t) for _, t in decoded), default=Place.start())
    if folded == 0:
        audit.not_compared.append(
            f"read model {model.name}: at position {position}, it has processed none of this"
            f" stream's {audit.events} events (the first is at position {_first(decoded)});"
            " nothing to compare. Run `turnlog projections run` (or serve) and verify again"
        )
    elif place < last:
        audit.compared.append(
            f"read model {model.name}: rows match the first {folded} of {audit.events} events"
        )
        audit.not_compared.append(
            f"read model {model.name}: events after position {position} (up to"
            f" {audit.last_position}) not processed yet, so not compared"
        )
    elif session is not None:
        found = disagreements(model.name, session, live)
        audit.problems.extend(
            f"read model {model.name} disagrees with the aggregate: {p}" for p in found
        )
        audit.compared.append(
            f"read model {model.name}: rows match all {audit.events} events and the aggregate"
        )
    else:
        audit.compared.append(f"read model {model.name}: rows match all {audit.events} events")
        audit.not_compared.append(
            f"read model {model.name}: not compared with the aggregate (it does not replay)"
        )


def _first(decoded: list[tuple[Any, Tracking]]) -> int:
    return min((t.notification_id for _, t in decoded), default=0)


def disagreements(name: str, session: Session, rows: list[Row]) -> list[str]:
    """How a read model's rows for a session contradict the aggregate's own state."""
    if name == "sessions":
        expected = {
            "status": session.status,
            "closed": session.closed,
            "turn_count": session.turn_count,
            "last_turn_state": str(session.last_turn.state) if session.last_turn else None,
            "version": session.version,
        }
        actual = [{k: r.get(k) for k in expected} for r in rows]
        return [] if actual == [expected] else [f"row {actual}, aggregate {expected}"]
    if name == "open_turns":
        want = {
            t.turn_id: (str(t.state), sorted(storable(c.call_id) for c in session.unknown_calls(t)))
            for t in session.turns
            if t.state.is_open
        }
        have = {r["turn_id"]: (r["state"], sorted(r["unknown_call_ids"])) for r in rows}
        return [] if have == want else [f"rows {have}, aggregate {want}"]
    # Rows hold texts as storable (NUL replaced); compare the aggregate's the same way.
    want_calls = {
        storable(c.call_id): (str(c.state), c.attempt, storable(c.name))
        for c in session.calls.values()
    }
    have_calls = {r["call_id"]: (r["state"], r["attempt"], r["tool"]) for r in rows}
    return [] if have_calls == want_calls else [f"rows {have_calls}, aggregate {want_calls}"]
