"""Read models: open turns, tool calls, workers, projections."""

from __future__ import annotations

from typing import Annotated, Literal
from uuid import UUID

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool

from turnlog.application.store.workers_registry import list_workers
from turnlog.interface.http.deps import MinPosition, ReadModelsDep, RuntimeDep, StateDep, caught_up
from turnlog.interface.http.listing_schemas import (
    OpenTurnRow,
    OpenTurnsSummaryOut,
    Page,
    ProjectionOut,
    ProjectionsOut,
    ToolCallActivityOut,
    ToolCallRow,
    WorkerOut,
    WorkersOut,
)
from turnlog.interface.http.reads import ReadRetryRoute
from turnlog.interface.http.schemas import problems
from turnlog.projections.activity import (
    MAX_BUCKETS,
    MAX_WINDOW_SECONDS,
    open_turn_summary,
    tool_call_activity,
)

router = APIRouter(prefix="/v1", tags=["read models"], route_class=ReadRetryRoute)

Limit = Annotated[int, Query(ge=1, le=500, description="Page size.")]
Cursor = Annotated[str | None, Query(max_length=200, description="From the previous page.")]


@router.get("/open-turns", response_model=Page[OpenTurnRow], responses=problems(401, 422, 503))
async def list_open_turns(
    state: StateDep,
    read_models: ReadModelsDep,
    turn_state: Annotated[
        Literal["queued", "running", "interrupted", "awaiting_approval"] | None,
        Query(alias="state"),
    ] = None,
    limit: Limit = 50,
    cursor: Cursor = None,
    min_position: MinPosition = None,
) -> Page[OpenTurnRow]:
    """Open turns (queued, running, interrupted) from the open-turns read model."""
    await caught_up(state, read_models, min_position, "open_turns")
    rows, next_cursor = await run_in_threadpool(
        read_models.list_open_turns, turn_state, limit, cursor
    )
    return Page[OpenTurnRow].model_validate({"items": rows, "next_cursor": next_cursor})


@router.get(
    "/open-turns/summary", response_model=OpenTurnsSummaryOut, responses=problems(401, 422, 503)
)
async def open_turns_summary(
    state: StateDep, read_models: ReadModelsDep, min_position: MinPosition = None
) -> OpenTurnsSummaryOut:
    """How many turns are queued, running and interrupted, and when the oldest of each
    was submitted."""
    await caught_up(state, read_models, min_position, "open_turns")
    items = await run_in_threadpool(open_turn_summary, read_models)
    return OpenTurnsSummaryOut.model_validate({"items": items})


@router.get("/tool-calls", response_model=Page[ToolCallRow], responses=problems(401, 422, 503))
async def list_tool_calls(
    state: StateDep,
    read_models: ReadModelsDep,
    status: Literal["pending", "started", "succeeded", "failed", "unknown", "resolved", "abandoned"]
    | None = None,
    session_id: UUID | None = None,
    tool: Annotated[str | None, Query(max_length=200)] = None,
    limit: Limit = 50,
    cursor: Cursor = None,
    min_position: MinPosition = None,
) -> Page[ToolCallRow]:
    """Tool calls and their status from the tool-call read model."""
    await caught_up(state, read_models, min_position, "tool_calls")
    rows, next_cursor = await run_in_threadpool(
        read_models.list_tool_calls, status, session_id, tool, limit, cursor
    )
    return Page[ToolCallRow].model_validate({"items": rows, "next_cursor": next_cursor})


@router.get(
    "/tool-calls/activity", response_model=ToolCallActivityOut, responses=problems(401, 422, 503)
)
async def tool_calls_activity(
    state: StateDep,
    read_models: ReadModelsDep,
    window_seconds: Annotated[
        int, Query(ge=60, le=MAX_WINDOW_SECONDS, description="How far back to look (seconds).")
    ] = 3600,
    buckets: Annotated[
        int, Query(ge=1, le=MAX_BUCKETS, description="Equal time buckets in the window.")
    ] = 12,
    min_position: MinPosition = None,
) -> ToolCallActivityOut:
    """Tool calls requested in the last `window_seconds` (default: one hour), counted by
    their current state, overall and in `buckets` equal time buckets, oldest first."""
    await caught_up(state, read_models, min_position, "tool_calls")
    activity = await run_in_threadpool(tool_call_activity, read_models, window_seconds, buckets)
    return ToolCallActivityOut.model_validate(activity)


@router.get("/workers", response_model=WorkersOut, responses=problems(401, 503))
def workers(runtime: RuntimeDep) -> WorkersOut:
    """Registered workers with their heartbeat; stopped ones show `stopped_at`."""
    rows = list_workers(runtime.db, runtime.settings.namespace)
    return WorkersOut(items=[WorkerOut.model_validate(r) for r in rows])


@router.get("/projections", response_model=ProjectionsOut, responses=problems(401, 503))
def projections(read_models: ReadModelsDep) -> ProjectionsOut:
    """Each projection's position in the log and how far it lags behind."""
    return ProjectionsOut(items=[ProjectionOut.model_validate(r) for r in read_models.status()])
