"""ASGI middleware: request ids, the bearer token, the body-size limit, request metrics.

Pure ASGI classes (not ``BaseHTTPMiddleware``) so that streaming responses
(server-sent events) pass through untouched and a client's disconnect
reaches the endpoint.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import re
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from fastapi.routing import iter_route_contexts
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from turnlog.application.log_context import only
from turnlog.interface.http.errors import PROBLEM_MEDIA_TYPE, problem_bytes, problem_headers
from turnlog.interface.http.tenancy import NAMESPACE_HEADER, Tenancy, needed
from turnlog.interface.problems import (
    InvalidRequest,
    NamespaceNotFound,
    PayloadTooLarge,
    Problem,
    RoleForbidden,
    Unauthorized,
    problem_for,
)

log = logging.getLogger("turnlog.http")

MAX_BODY_BYTES = 1024 * 1024
_SAFE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_UUID = r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}"
_SESSION_PATH = re.compile(rf"/v1/sessions/({_UUID})(?:/|$)")


async def send_problem(
    send: Send, problem: Problem, request_id: str | None, *, id_header: bool = False
) -> None:
    body = problem_bytes(problem, request_id)
    headers = [
        (b"content-type", PROBLEM_MEDIA_TYPE.encode()),
        (b"content-length", str(len(body)).encode()),
    ]
    headers += [(k.lower().encode(), v.encode()) for k, v in problem_headers(problem).items()]
    if request_id and id_header:
        headers.append((b"x-request-id", request_id.encode()))
    await send({"type": "http.response.start", "status": problem.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class RequestIdMiddleware:
    """Give every request an id (the client's X-Request-ID if sane), echo it, catch bugs.

    An exception that reaches this far is a bug: it is logged with the
    request id and answered with a 500 problem carrying the same id, so a
    user's report can be matched with the log line.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _incoming_id(scope) or uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        # Every line logged while handling the request (uvicorn's access line
        # included: it is written when the response starts) carries these ids.
        # Set from scratch: the connection's callbacks may carry another
        # request's ids (a body over the server's buffer pauses and resumes
        # reading from inside that request's context), and a new request on a
        # keep-alive connection starts from a copy of that context.
        with only(request_id=request_id, session_id=_session_in(scope.get("path", ""))):
            try:
                await self.app(scope, receive, send_with_id)
            except Exception:
                log.exception(
                    "unhandled error in %s %s [request %s]",
                    scope.get("method"),
                    scope.get("path"),
                    request_id,
                    extra={"request_id": request_id},
                )
                if started:
                    raise  # too late for a problem body; the server closes the connection
                bug = Problem(500, "Internal server error", "internal_error", _BUG_DETAIL)
                await send_problem(send, bug, request_id, id_header=True)


_BUG_DETAIL = "an unexpected error occurred; it was logged with this request id"


def _session_in(path: str) -> str | None:
    """The session id of a ``/v1/sessions/{id}…`` path (only a well-formed one)."""
    match = _SESSION_PATH.match(path)
    return match.group(1).lower() if match else None


def _incoming_id(scope: Scope) -> str | None:
    for key, value in scope.get("headers", []):
        if key == b"x-request-id":
            text = value.decode("latin-1")
            return text if _SAFE_ID.fullmatch(text) else None
    return None


GUARDED_PREFIXES = ("/v1/", "/console/fragments/")
UNAUTHORIZED = "a valid bearer token is required (Authorization: Bearer <token>)"


class TokenMiddleware:
    """With a token set, refuse /v1 and the console's data without it, before any body is read.

    The routes' own dependency (``require_token``) runs only after FastAPI has
    read and parsed the body, so a malformed body without a token was answered
    with the parser's 422; checking here answers 401 first, for every method.

    With a tenants file (``tenancy.multi``) the token's hash names its grant:
    the request's namespace and whether its role allows the route
    (``interface.http.tenancy``); both land in the request's state.
    """

    def __init__(
        self,
        app: ASGIApp,
        token: str | None,
        tenancy: Tenancy | None = None,
        routes: Callable[[], Sequence[BaseRoute]] | None = None,
    ) -> None:
        self.app = app
        self.token = token.encode() if token is not None else None
        self.tenancy = tenancy if tenancy is not None and tenancy.multi else None
        self.routes = routes
        self._templates: list[tuple[re.Pattern[str], frozenset[str], str]] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _guarded(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        if self.tenancy is not None:
            refused = self._admit(scope, self.tenancy)
            if refused is None:
                await self.app(scope, receive, send)
                return
        elif self.token is None or hmac.compare_digest(_bearer(scope), self.token):
            # Constant time: the comparison must not tell how much of a guess was right.
            await self.app(scope, receive, send)
            return
        else:
            refused = Unauthorized(UNAUTHORIZED)
        problem = problem_for(refused)
        assert problem is not None
        await send_problem(send, problem, scope.get("state", {}).get("request_id"))

    def _admit(self, scope: Scope, tenancy: Tenancy) -> Exception | None:
        grant = tenancy.grant_for(_bearer(scope))
        if grant is None:
            return Unauthorized(UNAUTHORIZED)
        asked = _header(scope, NAMESPACE_HEADER)
        namespace = tenancy.namespace_for(grant, asked)
        if namespace is None:
            # The same answer for a namespace that exists and one that does not.
            return NamespaceNotFound(f"no namespace {asked!r} is reachable with this token")
        method = scope.get("method", "GET")
        access = needed(method, self._template(scope))
        if not grant.access.allows(access):
            return RoleForbidden(
                f"the token's role {grant.access} cannot {method} this route; it needs {access}",
                role=str(grant.access),
                needed=str(access),
            )
        state = scope.setdefault("state", {})
        state["namespace"] = namespace
        state["grant"] = grant
        return None

    def _template(self, scope: Scope) -> str:
        """The template of the route that serves this path and method ('' for none)."""
        if self._templates is None:
            routes = self.routes() if self.routes is not None else ()
            self._templates = [
                (regex, frozenset(r.methods or ()), str(r.path))
                for r in iter_route_contexts(list(routes))
                if (regex := getattr(r, "path_regex", None)) is not None
            ]
        path, method = scope.get("path", ""), scope.get("method", "")
        for regex, methods, template in self._templates:
            if method in methods and regex.match(path):
                return template
        return ""


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def _guarded(path: str) -> bool:
    return path == "/v1" or path.startswith(GUARDED_PREFIXES)


def _bearer(scope: Scope) -> bytes:
    for key, value in scope.get("headers", []):
        if key == b"authorization":
            scheme, _, credentials = bytes(value).partition(b" ")
            return credentials if scheme.lower() == b"bearer" else b""
    return b""


class BodyLimitMiddleware:
    """Refuse bodies over ``limit`` bytes with 413 before anything parses them.

    A declared Content-Length over the limit is refused at once; otherwise
    the body is read (at most ``limit`` + one chunk) and handed on whole.
    """

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.limit:
            await self._refuse(scope, send, declared)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._refuse(scope, send, size)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        if _has_non_finite_number(body):
            refused = problem_for(InvalidRequest(NON_FINITE))
            assert refused is not None
            await send_problem(send, refused, scope.get("state", {}).get("request_id"))
            return
        await self.app(scope, _replay(body, receive), send)

    async def _refuse(self, scope: Scope, send: Send, size: int) -> None:
        refused = PayloadTooLarge(
            f"the request body is {'at least ' if size else ''}{size} bytes; "
            f"the limit is {self.limit} bytes",
            limit=self.limit,
        )
        problem = problem_for(refused)
        assert problem is not None
        await send_problem(send, problem, scope.get("state", {}).get("request_id"))


NON_FINITE = (
    "the request body holds a number JSON cannot represent (NaN, Infinity, -Infinity, "
    "or one too large for a double such as 1e400)"
)
# Only a body with one of these can hold a non-finite number; most bodies skip
# the second, strict parse. A match inside a string costs one parse, no refusal.
_SUSPECT = re.compile(rb"NaN|Infinity|[0-9][eE][+-]?[0-9]{3}|[0-9]{309}")


class _NonFinite(Exception):
    pass


def _refuse_constant(name: str) -> float:
    raise _NonFinite(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NonFinite(text)
    return value


def _has_non_finite_number(body: bytes) -> bool:
    """True when ``body`` is JSON with NaN, ±Infinity or a number that overflows a double.

    Python's parser accepts all of these; stored, they make the log non-JSON
    (``NaN`` is no JSON token) and read back as ``null``. Bodies that are not
    JSON at all are left to the route's own parsing and its 422.
    """
    if not _SUSPECT.search(body):
        return False
    try:
        json.loads(body, parse_constant=_refuse_constant, parse_float=_finite_float)
    except _NonFinite:
        return True
    except (ValueError, RecursionError):
        return False
    return False


def _content_length(scope: Scope) -> int | None:
    for key, value in scope.get("headers", []):
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: wait for the disconnect

    return replay


class MetricsMiddleware:
    """Count requests by method, route template and status; time them."""

    def __init__(
        self, app: ASGIApp, observe: Callable[[str, str, int, float, str | None], Any]
    ) -> None:
        self.app = app
        self.observe = observe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = scope.get("route")
            # The template, not the path: ids in paths would explode the label space.
            template = getattr(route, "path", None) or "unmatched"
            namespace = scope.get("state", {}).get("namespace")
            elapsed = time.perf_counter() - started
            self.observe(scope.get("method", ""), template, status, elapsed, namespace)
