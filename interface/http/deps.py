"""Dependencies of the routes: the parts of the process, auth, common headers.

Each is an ``Annotated`` alias so that a route's signature says what it
uses: ``RuntimeDep``, ``SessionsDep``, ``HistoryDep``, ``ReadModelsDep``.
The ones that only hand a part over are ``async``: FastAPI runs a plain
``def`` dependency in its thread pool, a hop to another thread and back for
each, three of them on every submitted turn.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import Depends, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from turnlog.application.errors import DatabaseUnavailable, InvalidPosition
from turnlog.application.runtime import Runtime
from turnlog.application.sessions import Sessions
from turnlog.application.store.history import History
from turnlog.application.store.pool import fail_fast
from turnlog.interface.http.state import AppState
from turnlog.interface.http.tenancy import Tenancy
from turnlog.interface.problems import InvalidRequest, NotReady, ReadModelLagging, Unauthorized
from turnlog.projections import ReadModels

_bearer = HTTPBearer(auto_error=False, description="The server's TURNLOG_API_TOKEN.")


async def get_state(request: Request) -> AppState:
    """The request's namespace's parts (the token's, with a tenants file: TokenMiddleware)."""
    return state_of(request)


def state_of(request: Request) -> AppState:
    tenancy: Tenancy = request.app.state.tenancy
    return tenancy.state(request.scope.get("state", {}).get("namespace"))


StateDep = Annotated[AppState, Depends(get_state)]


async def get_runtime(state: StateDep) -> Runtime:
    runtime = state.process.runtime
    if runtime is None:
        if isinstance(state.start_error, DatabaseUnavailable):
            raise DatabaseUnavailable(state.start_error.detail)
        raise NotReady("the server is starting; try again shortly")
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


async def get_sessions(runtime: RuntimeDep) -> Sessions:
    return runtime.sessions


SessionsDep = Annotated[Sessions, Depends(get_sessions)]


async def get_history(state: StateDep, runtime: RuntimeDep) -> History:
    if state.history is None:
        state.history = History(runtime.sessions)
    return state.history


HistoryDep = Annotated[History, Depends(get_history)]


async def get_read_models(state: StateDep, history: HistoryDep) -> ReadModels:
    # ``history`` is asked for so that it exists for ``caught_up`` (the log's head).
    if state.process.read_models is None:
        raise NotReady("the read models are not available in this process yet")
    return state.process.read_models


ReadModelsDep = Annotated[ReadModels, Depends(get_read_models)]


async def require_token(
    state: StateDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """With TURNLOG_API_TOKEN set, every /v1 route needs ``Authorization: Bearer <token>``."""
    token = state.process.settings.api_token
    if token is None:
        return
    given = credentials.credentials if credentials is not None else ""
    # Constant time: the comparison must not tell how much of a guess was right.
    if not hmac.compare_digest(given.encode(), token.get_secret_value().encode()):
        raise Unauthorized("a valid bearer token is required (Authorization: Bearer <token>)")


async def admits_session(state: StateDep) -> None:
    """A new session (a create or a fork) within the namespace's quotas, or 429."""
    if state.quota is not None:
        await run_in_threadpool(state.quota.admit_session)


async def admits_turn(state: StateDep) -> None:
    """A new turn within the namespace's quotas, or 429; nothing is written when refused."""
    if state.quota is not None:
        await run_in_threadpool(state.quota.admit_turn)


async def database_fails_fast() -> None:
    """A request is answered 503 at once when PostgreSQL is down, not after the pool's patience.

    Async, so that it runs in the request's own task: the setting holds for
    the rest of the request, threads it starts included (see application/store/pool.py).
    """
    fail_fast()


_QUERY_NAMES: dict[int, frozenset[str]] = {}
# Query parameters a route takes by prefix (``?metadata.team=a``), by route path.
QUERY_PREFIXES: dict[str, tuple[str, ...]] = {"/v1/sessions": ("metadata.",)}


async def known_query_only(request: Request) -> None:
    """Refuse query parameters the route does not declare: a typo must not pass silently."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return
    allowed = _QUERY_NAMES.get(id(route))
    if allowed is None:
        allowed = _QUERY_NAMES[id(route)] = frozenset(_query_names(dependant))
    prefixes = QUERY_PREFIXES.get(getattr(route, "path", ""), ())
    unknown = sorted(
        name
        for name in set(request.query_params) - allowed
        if not any(name.startswith(p) and len(name) > len(p) for p in prefixes)
    )
    if unknown:
        raise InvalidRequest(
            f"unknown query parameters: {', '.join(unknown)}", unknown_parameters=unknown
        )


def _query_names(dependant: Any) -> Iterator[str]:
    for field in dependant.query_params:
        yield str(field.alias)
    for sub in dependant.dependencies:
        yield from _query_names(sub)


IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=200,
        pattern=r"^[\x21-\x7e]+$",
        description="Repeat-safe key: a repeat with the same body returns the original result.",
    ),
]

MinPosition = Annotated[
    int | None,
    Query(
        ge=0,
        le=2**62,
        description="Wait (bounded) until the read model has processed this log position.",
    ),
]


async def caught_up(
    state: AppState, read_models: ReadModels, min_position: int | None, name: str
) -> None:
    """Wait until read model ``name`` reached ``min_position``, else ReadModelLagging (503).

    ``min_position`` is the position of an event (as a write returned it). A
    position past the end of the log, or one that names no event of this
    namespace's log (another namespace's, a rolled-back insert's), was never
    handed out by a write here: that is the client's mistake (422), not
    something worth waiting for.
    """
    if min_position is None:
        return
    timeout = state.options.min_position_timeout
    try:
        reached = await run_in_threadpool(read_models.wait_for, min_position, timeout, [name])
    except InvalidPosition as exc:
        raise InvalidRequest(f"min_position: {exc.detail}", **exc.extra) from None
    if not reached:
        raise ReadModelLagging(
            f"the read model has not reached position {min_position} within {timeout:g}s",
            min_position=min_position,
        )
