"""A session's stored events: pages of JSON, or a live stream of server-sent events."""

from __future__ import annotations

from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool

from turnlog.application.errors import SessionNotFound
from turnlog.interface.http.deltas import with_deltas
from turnlog.interface.http.deps import HistoryDep, StateDep
from turnlog.interface.http.reads import ReadRetryRoute
from turnlog.interface.http.schemas import EventOut, EventsPage, problems
from turnlog.interface.http.streams import EventStreamResponse, follow
from turnlog.interface.problems import InvalidRequest

router = APIRouter(prefix="/v1", tags=["events"], route_class=ReadRetryRoute)

_STREAM_DOC = {
    "text/event-stream": {
        "schema": {"type": "string"},
        "example": 'id: 2\nevent: TurnSubmitted\ndata: {"position": 7, "version": 2, …}\n\n',
    }
}


@router.get(
    "/sessions/{session_id}/events",
    response_model=EventsPage,
    responses={
        200: {"content": _STREAM_DOC, "description": "A page of events, or a live stream."},
        **problems(401, 404, 422, 503),
    },
)
async def session_events(
    request: Request,
    session_id: UUID,
    history: HistoryDep,
    state: StateDep,
    after: Annotated[int, Query(ge=0, le=2**62, description="Only events after this version.")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000, description="Page size (JSON only).")] = 100,
) -> Any:
    """Every stored event of the session: global position, version, type, topic,
    time and payload, in version order.

    With `Accept: text/event-stream` the answer is a live stream of
    server-sent events (`id` = version, `event` = type, `data` = the event
    as JSON) that follows new events until the client disconnects; resume
    with `Last-Event-ID` (a version) without losing or repeating an event.
    A comment line is sent every 15 s when nothing happens. The number of
    open streams is bounded: over it, 503 `too_many_streams`. An `after` or
    `Last-Event-ID` past the session's last version was not handed out for
    this session: 422, never a stream that waits for versions that may
    never come.

    While a model reply streams in this process, its pieces come as
    `event: delta` frames without an `id` (data: `session_id`, `turn_id`,
    `step`, `offset`, `text`): live only, never stored or replayed; the
    stored `ModelReplied` that follows holds the whole reply.
    """
    if "text/event-stream" in request.headers.get("accept", ""):
        resume = _last_event_id(request)
        start = resume or after
        last = await run_in_threadpool(history.last_version, session_id)
        if last is None:
            raise SessionNotFound(f"session {session_id} not found")
        _check_version("Last-Event-ID" if resume else "after", start, last)
        release = state.streams.acquire()
        options = state.options
        stream = follow(
            request,
            history,
            session_id,
            start,
            state.waits,
            options.heartbeat_seconds,
            state.draining,
        )
        runtime = state.process.runtime
        hub = runtime.executor.deltas if runtime is not None else None
        return EventStreamResponse(with_deltas(stream, hub, session_id), release)
    events = await run_in_threadpool(history.events, session_id, after, limit)
    if not events:
        last = await run_in_threadpool(history.last_version, session_id)
        if last is None:
            raise SessionNotFound(f"session {session_id} not found")
        _check_version("after", after, last)
    return EventsPage(
        session_id=session_id,
        events=[EventOut.model_validate(e, from_attributes=True) for e in events],
        next_after=events[-1].version if events else after,
    )


def _check_version(what: str, version: int, last: int) -> None:
    if version > last:
        raise InvalidRequest(
            f"{what} {version} is past the session's last version ({last}): not a version"
            " of this session's events",
            last_version=last,
        )


def _last_event_id(request: Request) -> int | None:
    raw = request.headers.get("last-event-id")
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = -1
    if not 0 <= value <= 2**62:
        raise InvalidRequest("Last-Event-ID must be an event version (a non-negative integer)")
    return value
