"""ASGI middleware: request ids, the body-size limit, request metrics.

Pure ASGI classes (not ``BaseHTTPMiddleware``) so that streaming responses
(server-sent events) pass through untouched and a client's disconnect
reaches the endpoint.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from turnlog.application.log_context import bound
from turnlog.interface.http.errors import PROBLEM_MEDIA_TYPE, problem_bytes, problem_headers
from turnlog.interface.problems import PayloadTooLarge, Problem, problem_for

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
        with bound(request_id=request_id, session_id=_session_in(scope.get("path", ""))):
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
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    async def _refuse(self, scope: Scope, send: Send, size: int) -> None:
        refused = PayloadTooLarge(
            f"the request body is {'at least ' if size else ''}{size} bytes; "
            f"the limit is {self.limit} bytes",
            limit=self.limit,
        )
        problem = problem_for(refused)
        assert problem is not None
        await send_problem(send, problem, scope.get("state", {}).get("request_id"))


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

    def __init__(self, app: ASGIApp, observe: Callable[[str, str, int, float], Any]) -> None:
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
            self.observe(scope.get("method", ""), template, status, time.perf_counter() - started)
