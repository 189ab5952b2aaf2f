"""Where each read model stands: position, log head, lag, and who runs it."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from psycopg import Connection

from turnlog.projections.catalog import ReadModel, read_models
from turnlog.projections.log import EventLog
from turnlog.projections.runner import projection_lock_key

# A bigint advisory key shows in pg_locks as classid (high half) and objid
# (low half), with objsubid 1.
_HOLDER = (
    "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
    " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
    " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    " AND l.classid::bigint = %s AND l.objid::bigint = %s"
)


def lock_holder(conn: Connection[Any], namespace: str, name: str) -> str | None:
    """The application_name of the connection holding a read model's lock, or None."""
    key = projection_lock_key(namespace, name)
    row = conn.execute(_HOLDER, ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF)).fetchone()
    if row is None:
        return None
    holder = row["application_name"] if isinstance(row, dict) else row[0]
    return str(holder) or "unknown"


def projection_status(
    events: EventLog, namespace: str, models: Sequence[ReadModel] | None = None
) -> list[dict[str, Any]]:
    """For each read model: name, position, head, lag_events, lag_seconds, running, holder.

    ``lag_seconds`` is the age of the oldest event the read model has not
    processed yet (0.0 when it is caught up; None when that event cannot be
    decoded). ``running`` says whether some process's runner holds the
    read model's lock; ``holder`` names that runner (host:pid).
    """
    head = events.head()
    result = []
    for model in models if models is not None else read_models():
        view = model.postgres_view(events.datastore)
        position = view.position(events.application_name)
        lag = events.count_after(position) if head > position else 0
        with events.datastore.get_connection() as conn:
            holder = lock_holder(conn, namespace, model.name)
        result.append(
            {
                "name": model.name,
                "position": position,
                "head": head,
                "lag_events": lag,
                "lag_seconds": _oldest_unprocessed_age(events, position) if lag else 0.0,
                "running": holder is not None,
                "holder": holder,
            }
        )
    return result


def _oldest_unprocessed_age(events: EventLog, position: int) -> float | None:
    notifications = events.read(position, 1)
    if not notifications:
        return 0.0
    try:
        [(event, _)] = events.decode(notifications)
    except Exception:
        return None
    recorded: datetime = event.timestamp
    age = (datetime.now(UTC) - recorded).total_seconds()
    return round(max(age, 0.0), 3)
