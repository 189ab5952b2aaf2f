"""Summaries of the read models for a status board: open turns and recent tool calls.

A status board needs the *trend*, not one number: ``tool_call_activity``
counts the calls requested in a recent window by their current state, in
equal time buckets (oldest first), in one query. The window is measured on
the database's clock, the same clock that stamped ``requested_at``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from psycopg import sql

from turnlog.application.errors import InvalidQuery
from turnlog.projections import open_turns, tool_calls
from turnlog.projections.catalog import READ_MODELS
from turnlog.projections.queries import ReadModels

MAX_WINDOW_SECONDS = 7 * 24 * 3600
MAX_BUCKETS = 120

# Buckets by requested_at; a call requested exactly at ``until`` joins the last bucket.
_ACTIVITY = """
WITH bounds AS (
    SELECT now() AS until, now() - make_interval(secs => %(window)s) AS since
)
SELECT b.until, b.since, t.state,
       least(floor(extract(epoch FROM t.requested_at - b.since) / %(width)s)::int,
             %(last)s) AS bucket,
       count(t.state) AS n
FROM bounds b
LEFT JOIN {table} t ON t.requested_at >= b.since AND t.requested_at <= b.until
GROUP BY b.until, b.since, t.state, bucket
"""


def tool_call_activity(
    read_models: ReadModels, window_seconds: int, buckets: int
) -> dict[str, Any]:
    """Calls requested in the last ``window_seconds``, by state, overall and per bucket.

    Returns ``since``/``until`` (datetimes), ``bucket_seconds``, ``by_state``
    (every state, zeros included) and ``buckets``: ``[{start, by_state, total}]``.
    """
    if not 1 <= window_seconds <= MAX_WINDOW_SECONDS or not 1 <= buckets <= MAX_BUCKETS:
        raise InvalidQuery(
            f"window_seconds must be 1 to {MAX_WINDOW_SECONDS} and buckets 1 to {MAX_BUCKETS}"
        )
    width = window_seconds / buckets
    events = read_models.events
    table_name = READ_MODELS["tool_calls"].tracking_table.removesuffix("_tracking")
    statement = sql.SQL(_ACTIVITY).format(
        table=sql.SQL("{}.{}").format(sql.Identifier(events.schema), sql.Identifier(table_name))
    )
    params = {"window": window_seconds, "width": width, "last": buckets - 1}
    with events.datastore.get_connection() as conn:
        rows = conn.execute(statement, params).fetchall()
    return _shape(rows, width, buckets)


def _zeros() -> dict[str, int]:
    return dict.fromkeys(tool_calls.STATES, 0)


def _shape(rows: list[Any], width: float, count: int) -> dict[str, Any]:
    since: datetime = rows[0]["since"]
    until: datetime = rows[0]["until"]
    totals = _zeros()
    per_bucket = [_zeros() for _ in range(count)]
    for row in rows:
        if row["state"] is None:
            continue  # the LEFT JOIN's row for a window without calls
        n = int(row["n"])
        totals[row["state"]] = totals.get(row["state"], 0) + n
        bucket = per_bucket[max(0, int(row["bucket"]))]
        bucket[row["state"]] = bucket.get(row["state"], 0) + n
    return {
        "since": since,
        "until": until,
        "bucket_seconds": width,
        "by_state": totals,
        "buckets": [
            {
                "start": since + timedelta(seconds=i * width),
                "by_state": counts,
                "total": sum(counts.values()),
            }
            for i, counts in enumerate(per_bucket)
        ],
    }


def open_turn_summary(read_models: ReadModels) -> list[dict[str, Any]]:
    """For each open state (queued, running, interrupted): how many turns, and the oldest.

    ``oldest_submitted_at`` is the submission time of the longest-open turn in
    that state (None when there is none): a count alone hides a stuck turn.
    """
    summary = []
    for state in open_turns.STATES:
        rows, _ = read_models.list_open_turns(state, 1)
        summary.append(
            {
                "state": state,
                "count": read_models.count_open_turns(state),
                "oldest_submitted_at": rows[0]["submitted_at"] if rows else None,
            }
        )
    return summary
