"""Auditing a session's snapshots: each against its seal and a replay of the events.

A snapshot is trusted by the next load, so ``turnlog audit --verify`` proves
each stored one (``application.store.seal``):

- its seal holds (the digest matches its stored bytes, the head it names is
  the hash of the event at its version); a snapshot stored before snapshots
  were sealed is reported as unsealed (a note: it is still compared);
- it decodes, and the session it restores equals the session replayed from
  the events up to its version, attribute by attribute (the names of the
  attributes that differ are reported, never their values).

Any difference, a seal that does not hold or a snapshot that does not decode
is a problem naming the stream and the version.
"""

from __future__ import annotations

from typing import Any, Protocol

from turnlog.application.store import seal
from turnlog.domain.session import Session
from turnlog.projections.log import EventLog

_MISSING = object()
_IGNORED = frozenset({"_pending_events"})


class Report(Protocol):
    """Where findings go (``projections.audit.StreamAudit``)."""

    problems: list[str]
    notes: list[str]
    compared: list[str]


def check_snapshots(events: EventLog, records: list[Any], audit: Report) -> None:
    """Check every stored snapshot of the stream of ``records`` (its decoded events)."""
    if not records:
        return
    session_id = records[0].session_id
    table = seal.snapshots_table_of(events.events_table)
    with events.datastore.get_connection() as conn:
        rows = seal.read_rows(conn, events.schema, table, session_id)
    for row in rows:
        _check_one(events, records, row, f"{events.schema}.{table}", audit)


def _check_one(
    events: EventLog, records: list[Any], row: seal.SealedRow, table: str, audit: Report
) -> None:
    where = f"snapshot of session {row.session_id} at version {row.version}"
    keep = events.sessions.snapshot_keep
    verdict = row.verdict()
    if verdict == seal.UNSEALED:
        audit.notes.append(
            f"{where} is unsealed (stored before snapshots were sealed): loads trust it"
            f" unchecked until sealed snapshots supersede it (the latest {keep} are kept);"
            f" to stop trusting it now, delete the unsealed rows of {table} (digest NULL):"
            " snapshots are a cache,"
            " the session then loads from its events until its next snapshot"
        )
    elif verdict:
        audit.problems.append(f"{where}: its seal does not hold: {verdict}")
    try:
        snapshot: Any = events.sessions.mapper.to_domain_event(row.stored)
        restored = snapshot.mutate(None)
    except Exception as exc:
        audit.problems.append(f"{where} does not decode: {type(exc).__name__}: {exc}")
        return
    replayed = _replay_to(records, row.version)
    if replayed is None:
        audit.problems.append(f"{where}: the events do not replay to version {row.version}")
        return
    if isinstance(restored, Session):
        events.sessions.complete_ranges(restored)
    differing = differences(restored, replayed)
    if differing:
        audit.problems.append(
            f"{where} differs from the replay of events 1..{row.version} in"
            f" {', '.join(differing)}: it was changed after it was stored"
        )
        return
    sealed = "unsealed" if verdict == seal.UNSEALED else "sealed" if not verdict else "seal broken"
    audit.compared.append(f"{where} ({sealed}) equals the replay of events 1..{row.version}")


def _replay_to(records: list[Any], version: int) -> Session | None:
    """The session as a load replays it (not retaining), from its events up to ``version``."""
    aggregate: Any = None
    for r in records:
        if r.version > version:
            break
        if r.event is None:
            return None
        try:
            aggregate = r.event.mutate(aggregate)
        except Exception:
            return None
    if not isinstance(aggregate, Session) or aggregate.version != version:
        return None
    return aggregate


def differences(restored: Any, replayed: Session) -> list[str]:
    """The attributes in which two sessions differ (an attribute absent is its class default)."""
    if type(restored) is not type(replayed):
        return [f"type ({type(restored).__name__})"]
    names = (set(vars(restored)) | set(vars(replayed))) - _IGNORED
    return sorted(
        name
        for name in names
        if getattr(restored, name, _MISSING) != getattr(replayed, name, _MISSING)
    )
