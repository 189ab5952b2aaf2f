"""Sessions: create, fork, list, show, close."""

from __future__ import annotations

from typing import Annotated, Any, Literal
from uuid import UUID

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.concurrency import run_in_threadpool

from turnlog.application.forks import fork_session
from turnlog.application.idempotency import start_once, start_session_once
from turnlog.application.runtime import Runtime
from turnlog.application.sessions import Written
from turnlog.application.tools.port import default_tools
from turnlog.application.views import describe_request, describe_session_summary, describe_turn
from turnlog.interface.http.deps import (
    IdempotencyKey,
    MinPosition,
    ReadModelsDep,
    RuntimeDep,
    SessionsDep,
    StateDep,
    admits_session,
    caught_up,
)
from turnlog.interface.http.listing_schemas import Page, SessionRow
from turnlog.interface.http.reads import ReadRetryRoute
from turnlog.interface.http.schemas import (
    CloseSessionRequest,
    CreateSessionRequest,
    ForkSessionRequest,
    ModelRequestOut,
    SessionOut,
    SessionWritten,
    TurnOut,
    problems,
)
from turnlog.interface.problems import InvalidRequest
from turnlog.projections.queries import decode_cursor, encode_cursor

router = APIRouter(prefix="/v1", tags=["sessions"], route_class=ReadRetryRoute)


@router.post(
    "/sessions",
    status_code=201,
    response_model=SessionWritten,
    responses=problems(401, 409, 410, 413, 422, 429, 503),
    dependencies=[Depends(admits_session)],
)
def create_session(
    body: CreateSessionRequest,
    runtime: RuntimeDep,
    response: Response,
    idempotency_key: IdempotencyKey = None,
) -> SessionWritten:
    """Create a session.

    With an `Idempotency-Key` header, a repeat with the same body returns the
    session the first request created (header `Idempotent-Replayed: true`);
    the same key with a different body is refused with 409
    `idempotency_key_reused`.
    """
    fields = _session_fields(runtime, body)
    if idempotency_key:
        request = body.model_dump(mode="json")
        for name in ("context", "approval_policy", "deadline_seconds"):
            if request.get(name) is None:
                # Bodies without them hash as they did before the fields existed.
                request.pop(name, None)
        started = start_session_once(
            runtime.sessions, runtime.settings.namespace, idempotency_key, request, **fields
        )
        written = started.written
        if not started.created:
            response.headers["Idempotent-Replayed"] = "true"
    else:
        written = runtime.sessions.create_session(**fields)
    response.headers["Location"] = f"/v1/sessions/{written.session_id}"
    return _written(runtime, written)


@router.post(
    "/sessions/{session_id}/fork",
    status_code=201,
    response_model=SessionWritten,
    responses=problems(401, 404, 409, 410, 413, 422, 429, 503),
    dependencies=[Depends(admits_session)],
)
def fork(
    session_id: UUID,
    body: ForkSessionRequest,
    runtime: RuntimeDep,
    response: Response,
    idempotency_key: IdempotencyKey = None,
) -> SessionWritten:
    """Start a new session from this one as it was at `version` (the source is only read).

    The fork's first event names the source, the version and the source's
    chain head there; its next model request is the source's request at that
    version (`GET …/request?version=`). A version inside an unfinished turn is
    409 `fork_inside_turn` (`fork_at_interrupted_turn` for an interrupted
    one); one the session never had is 422 `invalid_version`. With an
    `Idempotency-Key` header, a repeat with the same body returns the fork the
    first request made (header `Idempotent-Replayed: true`).
    """
    if body.metadata is not None:
        _refuse_reserved(body.metadata)

    def make(fork_id: UUID | None = None, mark: dict[str, Any] | None = None) -> Written:
        return fork_session(
            runtime.sessions,
            session_id,
            body.version,
            title=body.title,
            metadata=body.metadata,
            created_by=body.created_by or "api",
            session_id=fork_id,
            mark=mark,
        )

    if idempotency_key:
        request = {"fork_of": str(session_id), **body.model_dump(mode="json")}
        started = start_once(
            runtime.sessions, runtime.settings.namespace, idempotency_key, request, make
        )
        written = started.written
        if not started.created:
            response.headers["Idempotent-Replayed"] = "true"
    else:
        written = make()
    response.headers["Location"] = f"/v1/sessions/{written.session_id}"
    return _written(runtime, written)


def _refuse_reserved(metadata: dict[str, Any]) -> None:
    reserved = sorted(k for k in metadata if k.startswith("turnlog."))
    if reserved:
        raise InvalidRequest(f"metadata keys starting with 'turnlog.' are reserved: {reserved}")


def _session_fields(runtime: Runtime, body: CreateSessionRequest) -> dict[str, Any]:
    """The session's settings, with the server's defaults; refuse names it does not know."""
    known_tools = runtime.executor.tools.names()
    provider = body.provider or runtime.settings.provider
    if provider not in runtime.executor.providers.names():
        raise InvalidRequest(
            f"unknown provider {provider!r}", known_providers=runtime.executor.providers.names()
        )
    configured = runtime.settings.default_tool_names
    tools = default_tools(known_tools, provider, configured) if body.tools is None else body.tools
    unknown = sorted(set(tools) - set(known_tools))
    if unknown:
        raise InvalidRequest(f"unknown tools: {', '.join(unknown)}", known_tools=known_tools)
    _refuse_reserved(body.metadata)
    return {
        "title": body.title,
        "system_prompt": body.system_prompt,
        "provider": provider,
        "model": body.model or runtime.settings.model,
        "tools": list(dict.fromkeys(tools)),
        "tools_chosen": True,  # exactly these: an empty list offers none
        "metadata": body.metadata,
        "created_by": body.created_by or "api",
        **_context_fields(runtime, body),
        "approval_policy": body.approval_policy or runtime.settings.approval_policy,
        "deadline_seconds": body.deadline_seconds,
    }


def _context_fields(runtime: Runtime, body: CreateSessionRequest) -> dict[str, Any]:
    """The session's context policy: the body's, else the server's default."""
    if body.context is None:
        turns, chars = runtime.settings.context_max_turns, runtime.settings.context_max_chars
    else:
        turns, chars = body.context.max_turns, body.context.max_chars
    return {"context_max_turns": turns, "context_max_chars": chars}


def _written(runtime: Runtime, written: Written) -> SessionWritten:
    view = describe_session_summary(runtime.sessions.get_session(written.session_id))
    return SessionWritten.model_validate({**view, "position": written.position})


@router.get("/sessions", response_model=Page[SessionRow], responses=problems(401, 422, 503))
async def list_sessions(
    request: Request,
    state: StateDep,
    read_models: ReadModelsDep,
    status: Literal["idle", "busy", "blocked", "awaiting_approval", "closed"] | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
    min_position: MinPosition = None,
    q: Annotated[
        str | None,
        Query(max_length=200, description="Only sessions whose id or title starts with this."),
    ] = None,
    forked_from: Annotated[
        UUID | None, Query(description="Only the forks of this session (made from it).")
    ] = None,
) -> Page[SessionRow]:
    """List sessions from the sessions read model, most recent activity first.

    Pages are keyset-paginated: pass `next_cursor` as `cursor` for the next
    page (with the same filters). `?q=` keeps the sessions whose id or title
    starts with it (case-insensitive; at most 200 characters, else 422);
    `?metadata.KEY=VALUE` (repeatable, all must hold) those whose metadata has
    that value at that key (`5`, `true`, `null` also match the JSON number,
    boolean or null); `?forked_from=ID` the forks of session ID, which hold
    copies of its turns (a purge of ID does not reach them). With
    `?min_position=N` (a `position` from a write) the
    answer waits up to 5 s until the read model has processed it, else 503
    `read_model_lagging` with Retry-After.
    """
    metadata = [
        (name.removeprefix("metadata."), value)
        for name, value in request.query_params.multi_items()
        if name.startswith("metadata.")
    ]
    await caught_up(state, read_models, min_position, "sessions")
    rows, next_cursor = await run_in_threadpool(
        read_models.list_sessions, status, limit, cursor, None, q, metadata, forked_from
    )
    return Page[SessionRow].model_validate({"items": rows, "next_cursor": next_cursor})


@router.get(
    "/sessions/{session_id}", response_model=SessionOut, responses=problems(401, 404, 422, 503)
)
def get_session(session_id: UUID, sessions: SessionsDep) -> SessionOut:
    """A session rebuilt from its events: settings, status, turn counts and the open turn.

    Bounded whatever the session's length: its turns are at
    `GET /v1/sessions/{id}/turns`.
    """
    return SessionOut.model_validate(describe_session_summary(sessions.get_session(session_id)))


@router.get(
    "/sessions/{session_id}/turns",
    response_model=Page[TurnOut],
    responses=problems(401, 404, 422, 503),
)
def list_turns(
    session_id: UUID,
    sessions: SessionsDep,
    limit: Annotated[int, Query(ge=1, le=200, description="Page size.")] = 20,
    cursor: Annotated[str | None, Query(max_length=200, description="From the last page.")] = None,
) -> Page[TurnOut]:
    """The session's turns in full, newest first.

    Pass `next_cursor` as `cursor` for older turns; it is null on the page
    that reaches the first turn. Each page reads only its own turns' events.
    """
    key = decode_cursor(cursor, "turns", (int,))
    before = int(key[0]) if key else None
    _, page, following = sessions.turn_page(session_id, before, limit)
    items = [describe_turn(record, turn) for record, turn in page]
    next_cursor = encode_cursor("turns", (following,)) if following else None
    return Page[TurnOut].model_validate({"items": items, "next_cursor": next_cursor})


@router.get(
    "/sessions/{session_id}/request",
    response_model=ModelRequestOut,
    responses=problems(401, 404, 422, 503),
)
def get_request(
    session_id: UUID,
    sessions: SessionsDep,
    version: Annotated[int, Query(description="The session version to rebuild it at.")],
) -> ModelRequestOut:
    """The model request the runtime would have sent at `version` (for incident review).

    Rebuilt from the session's events up to that version: the request built
    right before a reply was recorded is the one the provider received. A
    version the session never had (below 1, past its latest) is 422
    `invalid_version`.
    """
    request = sessions.request_at(session_id, version)
    return ModelRequestOut.model_validate(describe_request(session_id, version, request))


@router.post(
    "/sessions/{session_id}/close",
    response_model=SessionWritten,
    responses=problems(401, 404, 409, 413, 422, 503),
)
def close_session(
    session_id: UUID, body: CloseSessionRequest, runtime: RuntimeDep
) -> SessionWritten:
    """Close a session: it takes no more turns. Refused (409) while a turn is open."""
    written = runtime.sessions.close_session(session_id, body.reason, body.actor)
    return _written(runtime, written)
