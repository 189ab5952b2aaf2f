"""What a purge needs of the read models: every one of them past the session's last event.

A runner that read a page holding the session's events folds them later;
if the purge dropped the session's rows in between, that fold would write
them again. So before the rows go, each read model is brought past the
session's last event (``catch_up``: folded here, or by its live runner),
and no later fold can hold one of them: the events are gone from the log
by the time any runner reads past that place.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from uuid import UUID

from psycopg import sql

from turnlog.application.store.logorder import Place
from turnlog.projections.catalog import READ_MODELS, read_models
from turnlog.projections.catch_up import catch_up
from turnlog.projections.queries import ReadModels


def reads_settler(reads: ReadModels, wait: float = 10.0) -> Callable[[Place], bool]:
    """A ``SettleReads`` for ``application.purge.Purger``: True once every read model is past."""

    def settle(place: Place) -> bool:
        places = reads.places()
        for model in read_models():
            if places[model.name] < place:
                catch_up(reads.events, reads.db, reads.settings.namespace, model, wait)
        return min(reads.places().values()) >= place

    return settle


def closed_before(reads: ReadModels) -> Callable[[datetime, int], list[UUID]]:
    """Retention's ``Candidates``: closed sessions last active before a cut-off, oldest first."""
    model = READ_MODELS["sessions"]
    statement = sql.SQL(
        "SELECT session_id FROM {}.{} WHERE closed AND last_activity_at < %s"
        " ORDER BY last_activity_at, session_id LIMIT %s"
    ).format(
        sql.Identifier(reads.events.schema),
        sql.Identifier(model.tracking_table.removesuffix("_tracking")),
    )

    def candidates(cutoff: datetime, limit: int) -> list[UUID]:
        with reads.events.datastore.get_connection() as conn:
            rows = conn.execute(statement, (cutoff, limit)).fetchall()
        return [UUID(str(r["session_id"])) for r in rows]

    return candidates
