"""Purging a session: its events and every trace of it go; a purge record stays."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from fastapi import APIRouter
from pydantic import BaseModel, Field

from turnlog.interface.http.deps import ReadModelsDep, RuntimeDep
from turnlog.interface.http.reads import ReadRetryRoute
from turnlog.interface.http.schemas import Strict, problems
from turnlog.interface.purging import build_purger

router = APIRouter(prefix="/v1", tags=["sessions"], route_class=ReadRetryRoute)


class PurgeRequest(Strict):
    """Purge a session (operators only): the one deletion of stored events."""

    reason: str = Field(min_length=1, max_length=2000, description="Why (kept in the record).")
    actor: str = Field(min_length=1, max_length=200, description="Who decides (kept).")


class PurgeOut(BaseModel):
    """The purge record that stays: who, why, when, and what existed."""

    session_id: UUID
    state: str = Field(description="`done` (a purge answers once it is).")
    actor: str
    reason: str
    requested_at: datetime
    completed_at: datetime | None
    events: int | None = Field(description="How many events the session had.")
    head_version: int | None = Field(description="Its last version.")
    head_hash: str | None = Field(
        description="The hash (hex) of its last event, the head of its hash chain"
        " (null for a stream stored before the chain)."
    )
    last_position: int | None = Field(description="The highest log position it held.")


@router.post(
    "/sessions/{session_id}/purge",
    response_model=PurgeOut,
    responses=problems(401, 404, 409, 413, 422, 503),
)
def purge_session(
    session_id: UUID, body: PurgeRequest, runtime: RuntimeDep, reads: ReadModelsDep
) -> PurgeOut:
    """Delete the session's events, snapshots, read-model rows and sandbox; keep a record.

    Afterwards every route of the session answers 410 `session_purged`.
    Refused (409) while a turn is open. A purge stopped halfway (the
    process died) is finished by asking again.
    """
    record = build_purger(runtime, reads).purge(session_id, body.reason, body.actor)
    return PurgeOut.model_validate(record.as_dict())
