"""Response bodies of the HTTP API's listings: rows of the read models.

Sessions, open turns and tool calls come from the projections a page at a
time, so a row may lag the session's own stream; workers and projections
are listed with where each stands.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Generic, Literal, TypeVar
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

from turnlog.interface.http.schemas import CallStateName, SessionStatusName, TurnStateName

T = TypeVar("T")

OpenTurnStateName = Literal["queued", "running", "interrupted", "awaiting_approval"]


class Page(BaseModel, Generic[T]):
    """A page of a read model; ``next_cursor`` is null on the last page."""

    items: list[T]
    next_cursor: str | None


class WorkerOut(BaseModel):
    """A registered worker process."""

    model_config = ConfigDict(extra="allow")

    worker_id: str
    pid: int
    host: str
    started_at: datetime | None
    heartbeat_at: datetime | None
    stopped_at: datetime | None = None


class WorkersOut(BaseModel):
    items: list[WorkerOut]


class ProjectionOut(BaseModel):
    """Where a read model stands in the log."""

    model_config = ConfigDict(extra="allow")

    name: str
    position: int
    head: int
    lag_events: int
    lag_seconds: float | None
    running: bool
    holder: str | None


class ProjectionsOut(BaseModel):
    items: list[ProjectionOut]


class SessionRow(BaseModel):
    """A session as the sessions read model lists it."""

    model_config = ConfigDict(extra="allow")

    session_id: UUID
    title: str | None
    status: SessionStatusName
    closed: bool
    turn_count: int
    last_turn_id: str | None
    last_turn_state: TurnStateName | None
    unknown_call_ids: list[str] | None
    created_by: str | None
    created_at: datetime | None
    last_activity_at: datetime | None
    last_position: int
    version: int
    metadata: dict[str, Any] | None = Field(
        None,
        description="Its metadata (null in rows folded before the column: a rebuild fills it).",
    )
    forked_from: UUID | None = Field(None, description="A fork's source (null: not a fork).")


class OpenTurnRow(BaseModel):
    """An open turn as the open-turns read model lists it."""

    model_config = ConfigDict(extra="allow")

    session_id: UUID
    turn_id: str
    state: OpenTurnStateName
    claim: int | None
    worker_id: str | None
    previous_worker: str | None
    unknown_call_ids: list[str] | None
    submitted_at: datetime | None
    submitted_position: int
    state_since: datetime | None
    proposed_call_ids: list[str] | None = None
    deadline_at: datetime | None = None


class ToolCallRow(BaseModel):
    """A tool call as the tool-call read model lists it."""

    model_config = ConfigDict(extra="allow")

    session_id: UUID
    call_id: str
    turn_id: str
    step: int | None
    tool: str
    effect: str | None
    state: CallStateName
    attempt: int | None
    worker_id: str | None
    outcome: str | None
    requested_at: datetime | None
    requested_position: int
    started_at: datetime | None
    finished_at: datetime | None
    duration_seconds: float | None
    result_summary: str | None
    error_summary: str | None


class OpenTurnStateOut(BaseModel):
    """How many turns are open in one state, and since when the oldest of them."""

    state: OpenTurnStateName
    count: int
    oldest_submitted_at: datetime | None


class OpenTurnsSummaryOut(BaseModel):
    """Open turns by state (from the open-turns read model)."""

    items: list[OpenTurnStateOut]


class ActivityBucketOut(BaseModel):
    """Tool calls requested within one bucket of the window, by their current state."""

    start: datetime
    by_state: dict[CallStateName, int]
    total: int


class ToolCallActivityOut(BaseModel):
    """Tool calls requested in a recent window, by current state, overall and per bucket."""

    since: datetime
    until: datetime
    bucket_seconds: float
    by_state: dict[CallStateName, int]
    buckets: list[ActivityBucketOut] = Field(description="Equal time buckets, oldest first.")
