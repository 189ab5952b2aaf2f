"""What both clients share: each request as data, the retry rule, answers into models, SSE.

A request may be sent again only when that cannot do a thing twice: it
never reached the server (the connection was refused), it is a read, or it
carries an ``Idempotency-Key`` (the server answers a repeat with what the
first one did). Anything else whose answer was lost raises
``ServerUnreachable`` rather than guessing.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar
from urllib.parse import urlsplit
from uuid import UUID

import httpx
from httpx_sse import ServerSentEvent
from pydantic import BaseModel, ValidationError

from turnlog.interface.client.errors import ApiError, NotATurnlogServer
from turnlog.interface.client.models import (
    CancelWritten,
    Delta,
    Event,
    EventsPage,
    Health,
    Metrics,
    ModelRequest,
    OpenTurnRow,
    OpenTurnsSummary,
    Page,
    Projections,
    PurgeRecord,
    Ready,
    Session,
    SessionRow,
    SessionWritten,
    ToolCallActivity,
    ToolCallRow,
    Turn,
    TurnWritten,
    Whoami,
    Workers,
)

M = TypeVar("M", bound=BaseModel)

# Each route of the API → the method of both clients that calls it (a test
# holds this against the server's /openapi.json).
ROUTES: dict[tuple[str, str], str] = {
    ("GET", "/healthz"): "health",
    ("GET", "/readyz"): "ready",
    ("GET", "/metrics"): "metrics",
    ("POST", "/v1/sessions"): "create_session",
    ("GET", "/v1/sessions"): "list_sessions",
    ("GET", "/v1/sessions/{session_id}"): "get_session",
    ("POST", "/v1/sessions/{session_id}/close"): "close_session",
    ("POST", "/v1/sessions/{session_id}/fork"): "fork_session",
    ("POST", "/v1/sessions/{session_id}/purge"): "purge_session",
    ("GET", "/v1/sessions/{session_id}/turns"): "list_turns",
    ("POST", "/v1/sessions/{session_id}/turns"): "submit_turn",
    ("GET", "/v1/sessions/{session_id}/request"): "get_request",
    ("GET", "/v1/sessions/{session_id}/turns/{turn_id}"): "get_turn",
    ("POST", "/v1/sessions/{session_id}/turns/{turn_id}/abandon"): "abandon_turn",
    ("POST", "/v1/sessions/{session_id}/turns/{turn_id}/cancel"): "cancel_turn",
    ("POST", "/v1/sessions/{session_id}/tool-calls/{call_id}/resolve"): "resolve_tool_call",
    ("POST", "/v1/sessions/{session_id}/tool-calls/{call_id}/approve"): "approve_call",
    ("POST", "/v1/sessions/{session_id}/tool-calls/{call_id}/reject"): "reject_call",
    ("GET", "/v1/sessions/{session_id}/events"): "events",
    ("GET", "/v1/open-turns"): "open_turns",
    ("GET", "/v1/open-turns/summary"): "open_turns_summary",
    ("GET", "/v1/tool-calls"): "tool_calls",
    ("GET", "/v1/tool-calls/activity"): "tool_call_activity",
    ("GET", "/v1/workers"): "workers",
    ("GET", "/v1/projections"): "projections",
    ("GET", "/v1/whoami"): "whoami",
}
ApprovalPolicy = Literal["none", "side_effecting", "all"]
RETRY_STATUSES = frozenset({502, 503, 504})
SessionRef = UUID | str


@dataclass(frozen=True)
class Call(Generic[M]):
    """One request and the model of its answer."""

    method: str
    path: str
    model: type[M]
    params: dict[str, Any] = field(default_factory=dict)
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    safe: bool = False  # may be sent again when its answer is lost
    timeout: float | None = None  # beyond the client's own, e.g. for ?wait=
    text: bool = False  # the answer is text (``/metrics``): the model holds it as ``text``

    def request_kwargs(self) -> dict[str, Any]:
        params = {k: v for k, v in self.params.items() if v is not None}
        kwargs: dict[str, Any] = {"params": params, "headers": self.headers}
        if self.body is not None:
            kwargs["json"] = self.body
        return kwargs


@dataclass(frozen=True)
class SessionPolicies:
    """A new session's policies; None leaves each to the server's default."""

    context_max_turns: int | None = None
    context_max_chars: int | None = None
    approval_policy: ApprovalPolicy | None = None
    deadline_seconds: float | None = None

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {}
        context = {"max_turns": self.context_max_turns, "max_chars": self.context_max_chars}
        if any(v is not None for v in context.values()):
            body["context"] = {k: v for k, v in context.items() if v is not None}
        if self.approval_policy is not None:
            body["approval_policy"] = self.approval_policy
        if self.deadline_seconds is not None:
            body["deadline_seconds"] = self.deadline_seconds
        return body


@dataclass(frozen=True)
class RetryPolicy:
    """How often, and how long apart, a safe request is sent again."""

    attempts: int = 4
    backoff: float = 0.25
    max_delay: float = 5.0

    def delay(self, attempt: int, response: httpx.Response | None = None) -> float:
        if response is not None:
            header = response.headers.get("retry-after", "")
            if header.strip().isdigit():
                return min(float(header), self.max_delay)
        base = min(self.backoff * 2.0 ** (attempt - 1), self.max_delay)
        return float(base * (0.5 + random.random() / 2))


def may_retry(call: Call[Any], error: httpx.TransportError) -> bool:
    """A refused connection never reached the server; other losses only for safe calls."""
    return isinstance(error, httpx.ConnectError | httpx.ConnectTimeout) or call.safe


def check_base_url(base_url: str) -> str:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(
            f"base_url must be an http(s) URL such as http://127.0.0.1:8000, not {base_url!r}"
        )
    return base_url.rstrip("/")


def auth_headers(token: str | None, namespace: str | None = None) -> dict[str, str]:
    """The token's header, and (for an admin token) the namespace to reach."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if namespace:
        headers["X-Turnlog-Namespace"] = namespace
    return headers


def _not_turnlog(response: httpx.Response, why: str) -> NotATurnlogServer:
    return NotATurnlogServer(
        f"{response.request.method} {response.request.url} {why}; is {response.request.url.scheme}"
        f"://{response.request.url.netloc.decode()} a turnlog server (base_url without /v1)?"
    )


def problem_of(response: httpx.Response) -> ApiError:
    """The typed error of a problem answer; anything else is not a turnlog server's."""
    ctype = response.headers.get("content-type", "")
    if ctype.startswith("application/problem+json"):
        try:
            body = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and isinstance(body.get("code"), str):
            if "retry-after" in response.headers and response.headers["retry-after"].isdigit():
                body.setdefault("retry_after", int(response.headers["retry-after"]))
            return ApiError(response.status_code, body)
    raise _not_turnlog(
        response,
        f"answered {response.status_code} with {ctype or 'no content type'}, not a problem",
    )


def decode(call: Call[M], response: httpx.Response) -> M:
    """The answer as the call's model, a typed ApiError, or NotATurnlogServer."""
    if response.status_code >= 400:
        raise problem_of(response)
    ctype = response.headers.get("content-type", "")
    if call.text and ctype.startswith("text/plain"):
        return call.model.model_validate({"text": response.text})
    if not ctype.startswith("application/json"):
        raise _not_turnlog(response, f"answered with {ctype or 'no content type'}, not JSON")
    try:
        return call.model.model_validate_json(response.content)
    except ValidationError as exc:
        raise _not_turnlog(
            response, f"answered JSON that is not a {call.model.__name__}: {exc.errors()[:1]}"
        ) from None


# ------------------------------------------------------------------ requests


def _sid(session_id: SessionRef) -> str:
    return str(UUID(str(session_id)))


def create_session(
    title: str,
    system_prompt: str,
    provider: str | None,
    model: str | None,
    tools: list[str] | None,
    metadata: Mapping[str, Any] | None,
    created_by: str,
    idempotency_key: str | None,
    policies: SessionPolicies | None = None,
) -> Call[SessionWritten]:
    body: dict[str, Any] = {
        "title": title,
        "system_prompt": system_prompt,
        "created_by": created_by,
    }
    chosen = (("provider", provider), ("model", model), ("tools", tools))
    body.update({k: v for k, v in chosen if v is not None})
    body.update((policies or SessionPolicies()).body())
    body["metadata"] = dict(metadata or {})
    key = idempotency_key or uuid.uuid4().hex
    return Call(
        "POST",
        "/v1/sessions",
        SessionWritten,
        body=body,
        headers={"Idempotency-Key": key},
        safe=True,
    )


def list_sessions(
    status: str | None,
    limit: int,
    cursor: str | None,
    min_position: int | None,
    search: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    forked_from: SessionRef | None = None,
) -> Call[Page[SessionRow]]:
    params: dict[str, Any] = {
        "status": status,
        "limit": limit,
        "cursor": cursor,
        "min_position": min_position,
        "q": search,
        "forked_from": None if forked_from is None else _sid(forked_from),
    }
    for key, value in (metadata or {}).items():
        text = value if isinstance(value, str) else json.dumps(value)
        params[f"metadata.{key}"] = text
    return Call("GET", "/v1/sessions", Page[SessionRow], params=params, safe=True)


def get_session(session_id: SessionRef) -> Call[Session]:
    return Call("GET", f"/v1/sessions/{_sid(session_id)}", Session, safe=True)


def close_session(session_id: SessionRef, actor: str, reason: str) -> Call[SessionWritten]:
    body = {"actor": actor, "reason": reason}
    return Call("POST", f"/v1/sessions/{_sid(session_id)}/close", SessionWritten, body=body)


def fork_session(
    session_id: SessionRef,
    version: int,
    title: str | None,
    metadata: Mapping[str, Any] | None,
    created_by: str,
    idempotency_key: str | None = None,
) -> Call[SessionWritten]:
    body: dict[str, Any] = {"version": version, "created_by": created_by}
    if title is not None:
        body["title"] = title
    if metadata is not None:
        body["metadata"] = dict(metadata)
    return Call(
        "POST",
        f"/v1/sessions/{_sid(session_id)}/fork",
        SessionWritten,
        body=body,
        headers={"Idempotency-Key": idempotency_key or uuid.uuid4().hex},
        safe=True,
    )


def purge_session(session_id: SessionRef, actor: str, reason: str) -> Call[PurgeRecord]:
    body = {"actor": actor, "reason": reason}
    return Call("POST", f"/v1/sessions/{_sid(session_id)}/purge", PurgeRecord, body=body)


def submit_turn(
    session_id: SessionRef,
    message: str,
    wait: float | None,
    idempotency_key: str | None,
    enqueue: bool = False,
    deadline_seconds: float | None = None,
) -> Call[TurnWritten]:
    key = idempotency_key or uuid.uuid4().hex
    body: dict[str, Any] = {"message": message}
    if deadline_seconds is not None:
        body["deadline_seconds"] = deadline_seconds
    return Call(
        "POST",
        f"/v1/sessions/{_sid(session_id)}/turns",
        TurnWritten,
        params={"wait": wait, "multitask": "enqueue" if enqueue else None},
        body=body,
        headers={"Idempotency-Key": key},
        safe=True,  # the key makes a repeat return the turn the first one created
        timeout=wait,
    )


def list_turns(session_id: SessionRef, limit: int, cursor: str | None) -> Call[Page[Turn]]:
    params = {"limit": limit, "cursor": cursor}
    path = f"/v1/sessions/{_sid(session_id)}/turns"
    return Call("GET", path, Page[Turn], params=params, safe=True)


def get_turn(session_id: SessionRef, turn_id: str) -> Call[Turn]:
    return Call("GET", f"/v1/sessions/{_sid(session_id)}/turns/{turn_id}", Turn, safe=True)


def abandon_turn(
    session_id: SessionRef, turn_id: str, reason: str, actor: str
) -> Call[TurnWritten]:
    path = f"/v1/sessions/{_sid(session_id)}/turns/{turn_id}/abandon"
    return Call("POST", path, TurnWritten, body={"reason": reason, "actor": actor})


def resolve_tool_call(
    session_id: SessionRef, call_id: str, outcome: str, result: Any, note: str, actor: str
) -> Call[TurnWritten]:
    path = f"/v1/sessions/{_sid(session_id)}/tool-calls/{call_id}/resolve"
    body = {"outcome": outcome, "result": result, "note": note, "actor": actor}
    return Call("POST", path, TurnWritten, body=body)


def cancel_turn(
    session_id: SessionRef, turn_id: str, reason: str, actor: str, force: bool
) -> Call[CancelWritten]:
    path = f"/v1/sessions/{_sid(session_id)}/turns/{turn_id}/cancel"
    body = {"reason": reason, "actor": actor, "force": force}
    # A repeat asks for what is already asked (or answers turn_finished): safe.
    return Call("POST", path, CancelWritten, body=body, safe=True)


def approve_call(
    session_id: SessionRef,
    call_id: str,
    actor: str,
    note: str,
    arguments: dict[str, Any] | None,
) -> Call[TurnWritten]:
    path = f"/v1/sessions/{_sid(session_id)}/tool-calls/{call_id}/approve"
    body: dict[str, Any] = {"actor": actor, "note": note}
    if arguments is not None:
        body["arguments"] = arguments
    return Call("POST", path, TurnWritten, body=body)


def reject_call(session_id: SessionRef, call_id: str, actor: str, reason: str) -> Call[TurnWritten]:
    path = f"/v1/sessions/{_sid(session_id)}/tool-calls/{call_id}/reject"
    return Call("POST", path, TurnWritten, body={"actor": actor, "reason": reason})


def events(session_id: SessionRef, after: int, limit: int) -> Call[EventsPage]:
    params = {"after": after, "limit": limit}
    return Call(
        "GET", f"/v1/sessions/{_sid(session_id)}/events", EventsPage, params=params, safe=True
    )


def open_turns(
    state: str | None, limit: int, cursor: str | None, min_position: int | None
) -> Call[Page[OpenTurnRow]]:
    params = {"state": state, "limit": limit, "cursor": cursor, "min_position": min_position}
    return Call("GET", "/v1/open-turns", Page[OpenTurnRow], params=params, safe=True)


def tool_calls(
    status: str | None,
    session_id: SessionRef | None,
    tool: str | None,
    limit: int,
    cursor: str | None,
    min_position: int | None,
) -> Call[Page[ToolCallRow]]:
    params = {
        "status": status,
        "session_id": None if session_id is None else _sid(session_id),
        "tool": tool,
        "limit": limit,
        "cursor": cursor,
        "min_position": min_position,
    }
    return Call("GET", "/v1/tool-calls", Page[ToolCallRow], params=params, safe=True)


def get_request(session_id: SessionRef, version: int | None) -> Call[ModelRequest]:
    path = f"/v1/sessions/{_sid(session_id)}/request"
    return Call("GET", path, ModelRequest, params={"version": version}, safe=True)


def open_turns_summary(min_position: int | None) -> Call[OpenTurnsSummary]:
    params = {"min_position": min_position}
    return Call("GET", "/v1/open-turns/summary", OpenTurnsSummary, params=params, safe=True)


def tool_call_activity(
    window_seconds: float | None, buckets: int | None, min_position: int | None
) -> Call[ToolCallActivity]:
    params = {"window_seconds": window_seconds, "buckets": buckets, "min_position": min_position}
    return Call("GET", "/v1/tool-calls/activity", ToolCallActivity, params=params, safe=True)


def health() -> Call[Health]:
    return Call("GET", "/healthz", Health, safe=True)


def ready() -> Call[Ready]:
    return Call("GET", "/readyz", Ready, safe=True)


def metrics() -> Call[Metrics]:
    return Call("GET", "/metrics", Metrics, safe=True, text=True)


def workers() -> Call[Workers]:
    return Call("GET", "/v1/workers", Workers, safe=True)


def projections() -> Call[Projections]:
    return Call("GET", "/v1/projections", Projections, safe=True)


def whoami() -> Call[Whoami]:
    return Call("GET", "/v1/whoami", Whoami, safe=True)


# ------------------------------------------------------------- event streams


def stream_path(session_id: SessionRef) -> str:
    return f"/v1/sessions/{_sid(session_id)}/events"


def stream_headers(last: int) -> dict[str, str]:
    # Last-Event-ID is the version of the last event received: the server
    # resumes exactly after it (versions are dense per session).
    return {"Accept": "text/event-stream", "Last-Event-ID": str(last)}


def check_stream(response: httpx.Response) -> None:
    ctype = response.headers.get("content-type", "")
    if not ctype.startswith("text/event-stream"):
        raise _not_turnlog(
            response, f"answered with {ctype or 'no content type'}, not an event stream"
        )


def frame_of(sse: ServerSentEvent) -> tuple[str, str | None, str] | None:
    """An event of the stream as (event, id, data); None for one without data."""
    return (sse.event, sse.id or None, sse.data) if sse.data else None


def item_of(frame: tuple[str, str | None, str], last: int, deltas: bool) -> Event | Delta | None:
    """The event or delta a frame carries, or None for one already seen or not asked for."""
    kind, _, data = frame
    try:
        if kind == "delta":
            return Delta.model_validate_json(data) if deltas else None
        event = Event.model_validate_json(data)
    except (ValidationError, json.JSONDecodeError) as exc:
        raise NotATurnlogServer(f"an event stream frame is not a turnlog event: {exc}") from None
    return event if event.version > last else None
