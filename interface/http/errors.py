"""Rendering errors as RFC 9457 problems (``application/problem+json``).

The status of every known error comes from ``interface.problems``; this
module only draws the response: ``type``, ``title``, ``status``, ``detail``,
the stable ``code``, the error's extra fields (``unknown_calls``, …), the
request id, and ``Retry-After`` / ``WWW-Authenticate`` where they apply.
An error the table does not know is a bug: 500, logged with the request id.
"""

from __future__ import annotations

import json
import logging
from typing import Any
from uuid import UUID

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import iter_route_contexts
from starlette.exceptions import HTTPException as StarletteHTTPException

from turnlog.application.errors import ApplicationError, SessionNotFound
from turnlog.domain.errors import DomainError
from turnlog.interface.problems import InvalidRequest, Problem, RequestRefused, problem_for

log = logging.getLogger("turnlog.http")

PROBLEM_MEDIA_TYPE = "application/problem+json"
# A URN, not a URL: the types are stable names, not pages anyone hosts.
TYPE_BASE = "urn:turnlog:problem:"

_HTTP_CODES = {
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    415: "unsupported_media_type",
}


class ProblemResponse(JSONResponse):
    media_type = PROBLEM_MEDIA_TYPE


def problem_body(problem: Problem, request_id: str | None) -> dict[str, Any]:
    # Extra fields come first so that none of them can overwrite a standard member.
    body: dict[str, Any] = dict(problem.extra)
    body.update(
        type=TYPE_BASE + problem.code.replace("_", "-"),
        title=problem.title,
        status=problem.status,
        detail=problem.detail,
        code=problem.code,
    )
    if request_id:
        body["request_id"] = request_id
    return body


def problem_headers(problem: Problem) -> dict[str, str]:
    headers = {}
    if problem.retry_after is not None:
        headers["Retry-After"] = str(problem.retry_after)
    if problem.status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="turnlog"'
    return headers


def render(problem: Problem, request_id: str | None) -> ProblemResponse:
    return ProblemResponse(
        problem_body(problem, request_id),
        status_code=problem.status,
        headers=problem_headers(problem),
    )


def problem_bytes(problem: Problem, request_id: str | None) -> bytes:
    """The body of a problem, for middleware that answers without a Response object."""
    return json.dumps(problem_body(problem, request_id)).encode()


def request_id_of(request: Request) -> str | None:
    return getattr(request.state, "request_id", None)


async def _known(request: Request, exc: Exception) -> ProblemResponse:
    if isinstance(exc, SessionNotFound):
        exc = await _purged_or(request, exc)
    problem = problem_for(exc)
    if problem is None:
        raise exc  # a bug: the request-id middleware answers 500 and logs it
    return render(problem, request_id_of(request))


async def _validation(request: Request, exc: Exception) -> ProblemResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [_plain_error(e) for e in exc.errors()]
    summary = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors[:5])
    refused = InvalidRequest(f"the request is invalid: {summary}", errors=errors)
    return await _known(request, refused)


async def _purged_or(request: Request, exc: SessionNotFound) -> Exception:
    """A route's "no such session" for a purged session is 410 ``session_purged``."""
    raw = request.path_params.get("session_id")
    tenancy = getattr(request.app.state, "tenancy", None)
    state = tenancy.state(request.scope.get("state", {}).get("namespace")) if tenancy else None
    runtime = state.process.runtime if state is not None else None
    if raw is None or runtime is None:
        return exc
    try:
        session_id = UUID(str(raw))
    except ValueError:
        return exc
    try:
        return await run_in_threadpool(runtime.sessions.missing, session_id)
    except Exception:  # the database went away meanwhile: the 404 stands
        return exc


def _plain_error(error: Any) -> dict[str, Any]:
    # Pydantic's ctx may hold exception objects; keep what is JSON and short.
    return {
        "loc": [str(part) for part in error.get("loc", ())],
        "msg": str(error.get("msg", "")),
        "type": str(error.get("type", "")),
    }


async def _http(request: Request, exc: Exception) -> ProblemResponse:
    # Statuses decided by routing itself (unknown path, wrong method), not by a rule.
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400:
        # FastAPI's answer to a body it cannot decode (not UTF-8, not JSON):
        # malformed input, which this API reports as every other: 422.
        return await _known(request, InvalidRequest(f"the request body is malformed: {exc.detail}"))
    code = _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
    title = str(exc.detail) if isinstance(exc.detail, str) else "HTTP error"
    problem = Problem(exc.status_code, title, code, title)
    response = render(problem, request_id_of(request))
    response.headers.update(exc.headers or {})
    if exc.status_code == 405:
        # Routing answers with the methods of the first route that matched the
        # path; RFC 9110 §15.5.6 asks for every method the resource supports.
        response.headers["Allow"] = ", ".join(allowed_methods(request))
    return response


def allowed_methods(request: Request) -> list[str]:
    """Every method some route of the app serves on the request's path."""
    path = request.scope.get("path", "")
    methods: set[str] = set()
    for route in iter_route_contexts(request.app.router.routes):
        regex = getattr(route, "path_regex", None)
        if regex is not None and regex.match(path):
            methods.update(route.methods or ())
    return sorted(methods)


def install(app: FastAPI) -> None:
    """Register the problem handlers on ``app``."""
    for cls in (DomainError, ApplicationError, RequestRefused):
        app.add_exception_handler(cls, _known)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _http)
    # Database drivers' "cannot reach the server" errors are in the table too.
    import psycopg
    from eventsourcing import persistence

    for driver_error in (
        psycopg.OperationalError,
        persistence.OperationalError,
        persistence.InterfaceError,
    ):
        app.add_exception_handler(driver_error, _known)
