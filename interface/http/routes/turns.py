"""Turns: submit (and optionally wait), inspect, and the operator's actions."""

from __future__ import annotations

from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Query, Response
from fastapi.concurrency import run_in_threadpool

from turnlog.application.sessions import Submitted
from turnlog.interface.http.deps import (
    HistoryDep,
    IdempotencyKey,
    RuntimeDep,
    SessionsDep,
    StateDep,
)
from turnlog.interface.http.reads import ReadRetryRoute
from turnlog.interface.http.schemas import (
    AbandonTurnRequest,
    ResolveToolCallRequest,
    SubmitTurnRequest,
    TurnOut,
    TurnWritten,
    problems,
)
from turnlog.interface.http.waiting import turn_view, until_finished

router = APIRouter(prefix="/v1", tags=["turns"], route_class=ReadRetryRoute)


def _turn_written(session_id: UUID, view: dict[str, Any], position: int | None) -> TurnWritten:
    return TurnWritten.model_validate({**view, "session_id": session_id, "position": position})


@router.post(
    "/sessions/{session_id}/turns",
    status_code=202,
    response_model=TurnWritten,
    responses={
        200: {"model": TurnWritten, "description": "The turn finished within `wait`."},
        **problems(401, 404, 409, 413, 422, 503),
    },
)
async def submit_turn(
    session_id: UUID,
    body: SubmitTurnRequest,
    runtime: RuntimeDep,
    history: HistoryDep,
    state: StateDep,
    response: Response,
    idempotency_key: IdempotencyKey = None,
    wait: Annotated[
        float | None,
        Query(gt=0, le=60, description="Wait up to this many seconds for the turn to finish."),
    ] = None,
) -> TurnWritten:
    """Submit a user message as a new turn.

    The turn is stored before the answer: 202 with the queued turn and the
    log position of its submission. With `?wait=S` the answer waits up to S
    seconds for the turn to finish (completed, failed, interrupted) and is
    200 with the finished turn, or 202 with its current state at the deadline;
    when every wait slot of the server is taken it is refused before anything
    is written (503 `too_many_waits`, with Retry-After).

    Refused with 409 while the last turn is open (`turn_in_progress`), when
    it is interrupted (`unresolved_turn`, listing the calls of unknown
    outcome), or when the session is closed (`session_closed`). A repeated
    `Idempotency-Key` returns the turn it created.
    """
    sessions = runtime.sessions
    # A wait slot is taken before anything is written: refused (503
    # too_many_waits) means not submitted, so a retry cannot submit twice.
    release = state.waits.acquire() if wait is not None else None
    try:
        submitted: Submitted = await run_in_threadpool(
            sessions.submit_turn, session_id, body.message, idempotency_key or ""
        )
        state.wake_worker(session_id)
        position = submitted.position
        if not submitted.created:
            response.headers["Idempotent-Replayed"] = "true"
            position = await run_in_threadpool(
                history.submission_position, session_id, submitted.turn_id
            )
        if wait is None:
            view = await run_in_threadpool(turn_view, sessions, session_id, submitted.turn_id)
        else:
            view, finished = await until_finished(
                state, sessions, session_id, submitted.turn_id, wait
            )
            if finished:
                response.status_code = 200
    finally:
        if release is not None:
            release()
    return _turn_written(session_id, view, position)


@router.get(
    "/sessions/{session_id}/turns/{turn_id}",
    response_model=TurnOut,
    responses=problems(401, 404, 422, 503),
)
def get_turn(session_id: UUID, turn_id: str, sessions: SessionsDep) -> TurnOut:
    """One turn: state, reply, error, and every tool call with its arguments,
    attempts, worker, times and outcome. For an interrupted turn this shows
    the calls of unknown outcome and the worker that was running them."""
    return TurnOut.model_validate(turn_view(sessions, session_id, turn_id))


@router.post(
    "/sessions/{session_id}/turns/{turn_id}/abandon",
    response_model=TurnWritten,
    responses=problems(401, 404, 409, 413, 422, 503),
)
def abandon_turn(
    session_id: UUID, turn_id: str, body: AbandonTurnRequest, runtime: RuntimeDep
) -> TurnWritten:
    """Give up an interrupted turn (recorded with actor and reason).

    Nothing the turn already did outside is undone; its unknown calls stay
    unknown, and the next turn may be submitted.
    """
    written = runtime.abandon_turn(session_id, turn_id, body.reason, body.actor)
    view = turn_view(runtime.sessions, session_id, turn_id)
    return _turn_written(session_id, view, written.position)


@router.post(
    "/sessions/{session_id}/tool-calls/{call_id}/resolve",
    response_model=TurnWritten,
    responses=problems(401, 404, 409, 413, 422, 503),
)
async def resolve_tool_call(
    session_id: UUID,
    call_id: str,
    body: ResolveToolCallRequest,
    runtime: RuntimeDep,
    state: StateDep,
) -> TurnWritten:
    """Record the real outcome of a tool call whose outcome is unknown.

    Once every unknown call of the turn is resolved the turn is running
    again and a worker continues it with the recorded results.
    """
    turn, written = await run_in_threadpool(
        runtime.resolve_tool_call,
        session_id,
        call_id,
        body.outcome,
        body.result,
        body.note,
        body.actor,
    )
    state.wake_worker(session_id)
    view = await run_in_threadpool(turn_view, runtime.sessions, session_id, turn.turn_id)
    return _turn_written(session_id, view, written.position)
