"""Where each read model stands: position, log head, lag, and who runs it."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from eventsourcing.persistence import Notification
from psycopg import Connection, sql

from turnlog.application.store import logorder
from turnlog.application.store.database import advisory_lock_holder
from turnlog.application.store.logorder import Place
from turnlog.projections.catalog import ReadModel, read_models
from turnlog.projections.leadership import projection_lock_key
from turnlog.projections.log import EventLog


def lock_holder(conn: Connection[Any], namespace: str, name: str) -> str | None:
    """The application_name of the connection holding a read model's lock, or None."""
    holder = advisory_lock_holder(conn, projection_lock_key(namespace, name))
    if holder is None:
        return None
    return holder.application_name or "unknown"


def projection_status(
    events: EventLog, namespace: str, models: Sequence[ReadModel] | None = None
) -> list[dict[str, Any]]:
    """For each read model: name, position, head, lag_events, lag_seconds, running, holder,
    and the commit horizon.

    ``position`` is the position of the last event the read model processed
    and ``head`` that of the last committed event, both in the log's order
    (``application.store.logorder``). ``lag_seconds`` is the age of the oldest event
    the read model has not processed yet (0.0 when it is caught up; None when
    that event cannot be decoded). ``running`` says whether some process's
    runner holds the read model's lock; ``holder`` names that runner
    (host:pid). ``horizon_age_seconds`` and ``horizon_pid`` say how long the
    oldest transaction still running in the cluster has run, and its server
    pid: committed events past it wait until it ends (``horizon_waiting``).
    """
    head = events.head_place()
    horizon = events.horizon()
    result = []
    for model in models if models is not None else read_models():
        view = model.postgres_view(events.datastore)
        place = view.position(events.application_name)
        lag = events.count_after(place) if head > place else 0
        with events.datastore.get_connection() as conn:
            holder = lock_holder(conn, namespace, model.name)
        result.append(
            {
                "name": model.name,
                "position": place.position,
                "head": head.position,
                "lag_events": lag,
                "lag_seconds": _oldest_unprocessed_age(events, place) if lag else 0.0,
                "running": holder is not None,
                "holder": holder,
                "horizon_age_seconds": horizon["age_seconds"],
                "horizon_pid": horizon["pid"],
                "horizon_waiting": head.xact >= horizon["xact"],
            }
        )
    return result


def _oldest_unprocessed_age(events: EventLog, place: Place) -> float | None:
    page = events.read(place, 1)
    records = page.records
    if not records:
        # Held back by the horizon: the oldest committed event past it.
        records = _first_past(events, place)
    if not records:
        return 0.0
    try:
        [(event, _)] = events.decode(records)
    except Exception:
        return None
    recorded: datetime = event.timestamp
    age = (datetime.now(UTC) - recorded).total_seconds()
    return round(max(age, 0.0), 3)


def _first_past(events: EventLog, place: Place) -> list[tuple[Place, Any]]:
    statement = sql.SQL(
        "SELECT notification_id, originator_id, originator_version, topic, state,"
        " {xact}::text AS xact FROM {t} WHERE {past} ORDER BY {order} LIMIT 1"
    ).format(xact=logorder.XACT, t=events.table, past=logorder.PAST, order=logorder.LOG_ORDER)
    with events.datastore.get_connection() as conn:
        row = conn.execute(statement, place.params()).fetchone()
    if row is None:
        return []
    notification = Notification(
        id=int(row["notification_id"]),
        originator_id=row["originator_id"],
        originator_version=int(row["originator_version"]),
        topic=str(row["topic"]),
        state=bytes(row["state"]),
    )
    return [(Place(int(row["xact"]), notification.id), notification)]


def describe_horizon(row: dict[str, Any]) -> str:
    """One line on the commit horizon, from a status row (what readers of the log wait for)."""
    age = float(row.get("horizon_age_seconds") or 0.0)
    pid = row.get("horizon_pid")
    if pid is None and age == 0.0:
        return "commit horizon: no transaction is holding readers back"
    who = f"server pid {pid}" if pid is not None else "a prepared transaction"
    waiting = "; committed events wait behind it" if row.get("horizon_waiting") else ""
    return f"commit horizon: held by {who}, its transaction running for {age:.1f}s{waiting}"
