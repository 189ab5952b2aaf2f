"""Turns: submit (and optionally wait), inspect, and the operator's actions."""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal
from uuid import UUID

from fastapi import APIRouter, Depends, Header, Query, Response
from fastapi.concurrency import run_in_threadpool

from turnlog.application.sessions import Submitted
from turnlog.interface.http.deps import (
    HistoryDep,
    IdempotencyKey,
    RuntimeDep,
    SessionsDep,
    StateDep,
    admits_turn,
)
from turnlog.interface.http.reads import ReadRetryRoute
from turnlog.interface.http.schemas import (
    AbandonTurnRequest,
    ApproveToolCallRequest,
    CancelTurnRequest,
    CancelWritten,
    RejectToolCallRequest,
    ResolveToolCallRequest,
    SubmitTurnRequest,
    TurnOut,
    TurnWritten,
    problems,
)
from turnlog.interface.http.waiting import turn_view, until_finished
from turnlog.interface.tracing import trace_context

router = APIRouter(prefix="/v1", tags=["turns"], route_class=ReadRetryRoute)


def _turn_written(session_id: UUID, view: dict[str, Any], position: int | None) -> TurnWritten:
    return TurnWritten.model_validate({**view, "session_id": session_id, "position": position})


@router.post(
    "/sessions/{session_id}/turns",
    status_code=202,
    response_model=TurnWritten,
    responses={
        200: {"model": TurnWritten, "description": "The turn finished within `wait`."},
        **problems(401, 404, 409, 413, 422, 429, 503),
    },
    dependencies=[Depends(admits_turn)],
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
    multitask: Annotated[
        Literal["reject", "enqueue"],
        Query(
            description="While a turn is queued or running: `reject` (409 turn_in_progress)"
            " or `enqueue` (queue this one behind it; turns run in the order submitted)."
        ),
    ] = "reject",
    traceparent: Annotated[
        str | None,
        Header(
            include_in_schema=False,  # W3C trace context: a malformed one is ignored, not refused
        ),
    ] = None,
) -> TurnWritten:
    """Submit a user message as a new turn.

    The turn is stored before the answer: 202 with the queued turn and the
    log position of its submission, and `Location` naming the turn. With
    `?wait=S` the answer waits up to S seconds for the turn to finish
    (completed, failed, interrupted, abandoned, cancelled) and is 200 with the
    finished turn, or 202 with its current state at the deadline; when every
    wait slot of the server is taken it is refused before anything is written
    (503 `too_many_waits`, with Retry-After).

    Refused with 409 while a turn is queued or running (`turn_in_progress`)
    unless `?multitask=enqueue`, when it is interrupted (`unresolved_turn`,
    listing the calls of unknown outcome; also with `enqueue`), or when the
    session is closed (`session_closed`). A repeated `Idempotency-Key`
    returns the turn it created, while the session remembers it (its last
    `TURNLOG_IDEMPOTENCY_WINDOW` keyed turns and its open ones); an older key
    is a new turn. `deadline_seconds` bounds the turn in time:
    past it, the runtime cancels it (reason `deadline`).
    """
    sessions = runtime.sessions
    # A wait slot is taken before anything is written: refused (503
    # too_many_waits) means not submitted, so a retry cannot submit twice.
    release = state.waits.acquire() if wait is not None else None
    # Watched before the submit: its ending, however soon, wakes the wait below.
    watching = state.waits.watch(session_id, ending_only=True) if wait is not None else None
    try:
        submitted: Submitted = await run_in_threadpool(
            functools.partial(
                sessions.submit_turn,
                session_id,
                body.message,
                idempotency_key or "",
                enqueue=multitask == "enqueue",
                deadline_seconds=body.deadline_seconds,
                traceparent=trace_context(traceparent),
            )
        )
        position = submitted.position
        if not submitted.created:
            response.headers["Idempotent-Replayed"] = "true"
            position = await run_in_threadpool(
                history.submission_position, session_id, submitted.turn_id
            )
        if wait is None or watching is None:
            view = await run_in_threadpool(turn_view, sessions, session_id, submitted.turn_id)
        else:
            view, finished = await until_finished(
                state,
                sessions,
                session_id,
                submitted.turn_id,
                wait,
                watching,
                # A replayed submit's turn may have ended long ago: read it first.
                read_first=not submitted.created,
            )
            if finished:
                response.status_code = 200
        if response.status_code != 200:  # 202: where to ask for the turn from now on
            response.headers["Location"] = f"/v1/sessions/{session_id}/turns/{submitted.turn_id}"
    finally:
        if watching is not None:
            state.waits.unwatch(session_id, watching)
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
    view = await run_in_threadpool(turn_view, runtime.sessions, session_id, turn.turn_id)
    return _turn_written(session_id, view, written.position)


@router.post(
    "/sessions/{session_id}/turns/{turn_id}/cancel",
    response_model=CancelWritten,
    responses=problems(401, 404, 409, 413, 422, 503),
)
async def cancel_turn(
    session_id: UUID,
    turn_id: str,
    body: CancelTurnRequest,
    runtime: RuntimeDep,
) -> CancelWritten:
    """Stop a turn (recorded with actor and reason).

    A queued turn, or one awaiting approval, is cancelled at once
    (`cancel: cancelled`). A running one gets a request (`cancel: requested`):
    its worker stops at the next step boundary, stopping a read_only or
    idempotent call in flight (its process group is killed) and letting a
    side_effecting one finish — unless `force`, which kills it too: its
    outcome is then unknown and the turn interrupted. 409 `turn_finished`
    for a turn that has already ended.
    """
    done, written = await run_in_threadpool(
        runtime.cancel_turn, session_id, turn_id, body.reason, body.actor, body.force
    )
    view = await run_in_threadpool(turn_view, runtime.sessions, session_id, turn_id)
    return CancelWritten.model_validate(
        {**view, "session_id": session_id, "position": written.position, "cancel": done}
    )


@router.post(
    "/sessions/{session_id}/tool-calls/{call_id}/approve",
    response_model=TurnWritten,
    responses=problems(401, 404, 409, 413, 422, 503),
)
async def approve_tool_call(
    session_id: UUID,
    call_id: str,
    body: ApproveToolCallRequest,
    runtime: RuntimeDep,
) -> TurnWritten:
    """Let a proposed tool call start (recorded with actor and note).

    Edited `arguments` replace the model's and must match the tool's schema
    (422 `invalid_tool_arguments`). A call that is not waiting for approval
    is refused with 409 `call_not_proposed`.
    """
    turn, written = await run_in_threadpool(
        runtime.approve_tool_call, session_id, call_id, body.actor, body.note, body.arguments
    )
    view = await run_in_threadpool(turn_view, runtime.sessions, session_id, turn.turn_id)
    return _turn_written(session_id, view, written.position)


@router.post(
    "/sessions/{session_id}/tool-calls/{call_id}/reject",
    response_model=TurnWritten,
    responses=problems(401, 404, 409, 413, 422, 503),
)
async def reject_tool_call(
    session_id: UUID,
    call_id: str,
    body: RejectToolCallRequest,
    runtime: RuntimeDep,
) -> TurnWritten:
    """Refuse a proposed tool call: the model is told "rejected by operator: reason",
    and the turn goes on. 409 `call_not_proposed` for a call not waiting for approval."""
    turn, written = await run_in_threadpool(
        runtime.reject_tool_call, session_id, call_id, body.actor, body.reason
    )
    view = await run_in_threadpool(turn_view, runtime.sessions, session_id, turn.turn_id)
    return _turn_written(session_id, view, written.position)
