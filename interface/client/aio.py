"""``turnlog.AsyncClient``: the HTTP API from Python, for asyncio, on httpx."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal, TypeVar

import httpx
from httpx_sse import EventSource
from pydantic import BaseModel

from turnlog.interface.client import calls
from turnlog.interface.client.calls import (
    ApprovalPolicy,
    Call,
    RetryPolicy,
    SessionPolicies,
    SessionRef,
)
from turnlog.interface.client.errors import ApiError, ServerUnreachable, TurnWaitTimeout
from turnlog.interface.client.models import (
    CancelWritten,
    Delta,
    Event,
    EventsPage,
    Health,
    ModelRequest,
    OpenTurnRow,
    OpenTurnsSummary,
    OpenTurnState,
    Page,
    Projections,
    PurgeRecord,
    Ready,
    Session,
    SessionRow,
    SessionStatus,
    SessionWritten,
    ToolCallActivity,
    ToolCallRow,
    Turn,
    TurnWritten,
    Whoami,
    Workers,
)

M = TypeVar("M", bound=BaseModel)


class AsyncClient:
    """A turnlog server's API for asyncio: the same methods as ``Client``, awaited.

    ``AsyncClient("http://127.0.0.1:8000", token=...)``. Answers are typed models;
    a refusal raises ``ApiError`` with the problem's stable ``code``. Safe
    requests (reads, and writes carrying an ``Idempotency-Key``, which
    ``create_session`` and ``submit_turn`` generate unless given one) are sent
    again when their answer is lost or the server is briefly unavailable.
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        namespace: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = calls.check_base_url(base_url)
        self.retry = retry or RetryPolicy()
        self.timeout = timeout
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=calls.auth_headers(token, namespace),
            timeout=timeout,
            transport=transport,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _send(self, call: Call[M]) -> M:
        timeout = self.timeout + (call.timeout or 0)
        for attempt in range(1, self.retry.attempts + 1):
            last = attempt == self.retry.attempts
            try:
                response = await self._http.request(
                    call.method, call.path, timeout=timeout, **call.request_kwargs()
                )
            except httpx.TransportError as exc:
                if last or not calls.may_retry(call, exc):
                    raise ServerUnreachable(f"{call.method} {call.path}: {exc!r}") from exc
                await asyncio.sleep(self.retry.delay(attempt))
                continue
            if response.status_code in calls.RETRY_STATUSES and call.safe and not last:
                await asyncio.sleep(self.retry.delay(attempt, response))
                continue
            return calls.decode(call, response)
        raise AssertionError("unreachable")  # pragma: no cover

    # ------------------------------------------------------------- sessions

    async def create_session(
        self,
        title: str = "",
        *,
        system_prompt: str = "",
        provider: str | None = None,
        model: str | None = None,
        tools: list[str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        created_by: str = "",
        idempotency_key: str | None = None,
        context_max_turns: int | None = None,
        context_max_chars: int | None = None,
        approval_policy: ApprovalPolicy | None = None,
        deadline_seconds: float | None = None,
    ) -> SessionWritten:
        """Create a session (with a generated Idempotency-Key unless one is given).

        ``context_max_turns`` / ``context_max_chars``: the context-window policy
        (the oldest turns are summarised first); ``approval_policy``: which tool
        calls wait for an operator; ``deadline_seconds``: each turn's default
        deadline. None leaves each to the server's default.
        """
        policies = SessionPolicies(
            context_max_turns, context_max_chars, approval_policy, deadline_seconds
        )
        return await self._send(
            calls.create_session(
                title,
                system_prompt,
                provider,
                model,
                tools,
                metadata,
                created_by,
                idempotency_key,
                policies,
            )
        )

    async def list_sessions(
        self,
        *,
        status: SessionStatus | None = None,
        limit: int = 50,
        cursor: str | None = None,
        min_position: int | None = None,
        search: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        forked_from: SessionRef | None = None,
    ) -> Page[SessionRow]:
        """One page of the sessions read model; pass ``next_cursor`` back for the next.

        ``search``: sessions whose id or title starts with it; ``metadata``: whose
        metadata holds every one of these values (``?metadata.KEY=VALUE``);
        ``forked_from``: the forks of that session.
        """
        return await self._send(
            calls.list_sessions(status, limit, cursor, min_position, search, metadata, forked_from)
        )

    async def iter_sessions(
        self,
        *,
        status: SessionStatus | None = None,
        page_size: int = 100,
        min_position: int | None = None,
        search: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        forked_from: SessionRef | None = None,
    ) -> AsyncIterator[SessionRow]:
        """Every session of the read model, page after page."""
        cursor: str | None = None
        while True:
            page = await self.list_sessions(
                status=status,
                limit=page_size,
                cursor=cursor,
                min_position=min_position,
                search=search,
                metadata=metadata,
                forked_from=forked_from,
            )
            for row in page.items:
                yield row
            if page.next_cursor is None:
                return
            cursor, min_position = page.next_cursor, None

    async def get_session(self, session_id: SessionRef) -> Session:
        """A session: settings, status, turn counts and its open turn (turns: ``list_turns``)."""
        return await self._send(calls.get_session(session_id))

    async def close_session(
        self, session_id: SessionRef, *, actor: str, reason: str = ""
    ) -> SessionWritten:
        """Close a session: it takes no more turns."""
        return await self._send(calls.close_session(session_id, actor, reason))

    async def fork_session(
        self,
        session_id: SessionRef,
        *,
        version: int,
        title: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        created_by: str = "",
        idempotency_key: str | None = None,
    ) -> SessionWritten:
        """A new session going on from this one as it was at ``version`` (between turns).

        Its next model request is the source's at that version; omitted title
        and metadata are the source's. Sent with an ``Idempotency-Key`` (generated
        unless given), so a lost answer is retried and finds the same fork.
        """
        return await self._send(
            calls.fork_session(session_id, version, title, metadata, created_by, idempotency_key)
        )

    async def purge_session(
        self, session_id: SessionRef, *, actor: str, reason: str
    ) -> PurgeRecord:
        """Purge a session: its events go, a record stays; then it answers 410."""
        return await self._send(calls.purge_session(session_id, actor, reason))

    # ---------------------------------------------------------------- turns

    async def submit_turn(
        self,
        session_id: SessionRef,
        message: str,
        *,
        wait: float | None = None,
        idempotency_key: str | None = None,
        enqueue: bool = False,
        deadline_seconds: float | None = None,
    ) -> TurnWritten:
        """Submit a user message; with ``wait`` (up to 60 s) return the finished turn if it
        finishes in time. A generated Idempotency-Key makes a lost answer safe to retry.

        ``enqueue``: queue it behind a queued or running turn (``?multitask=enqueue``)
        instead of being refused; ``deadline_seconds``: when the runtime cancels it.
        """
        call = calls.submit_turn(
            session_id, message, wait, idempotency_key, enqueue, deadline_seconds
        )
        return await self._send(call)

    async def list_turns(
        self, session_id: SessionRef, *, limit: int = 20, cursor: str | None = None
    ) -> Page[Turn]:
        """A page of the session's turns in full, newest first; pass ``next_cursor`` on."""
        return await self._send(calls.list_turns(session_id, limit, cursor))

    async def get_turn(self, session_id: SessionRef, turn_id: str) -> Turn:
        return await self._send(calls.get_turn(session_id, turn_id))

    async def wait_for_turn(
        self, session_id: SessionRef, turn_id: str, timeout: float = 60.0
    ) -> Turn:
        """Ask for the turn until it stops moving on its own; ``TurnWaitTimeout`` after ``timeout``.

        The error holds the turn as last seen: it goes on running on the server.
        """
        turn = await self.get_turn(session_id, turn_id)
        deadline = time.monotonic() + timeout
        while not turn.finished:
            if time.monotonic() >= deadline:
                raise TurnWaitTimeout(turn, timeout)
            await asyncio.sleep(0.2)
            turn = await self.get_turn(session_id, turn_id)
        return turn

    async def abandon_turn(
        self, session_id: SessionRef, turn_id: str, *, reason: str, actor: str
    ) -> TurnWritten:
        """Give up an interrupted turn (recorded with actor and reason)."""
        return await self._send(calls.abandon_turn(session_id, turn_id, reason, actor))

    async def resolve_tool_call(
        self,
        session_id: SessionRef,
        call_id: str,
        *,
        outcome: Literal["succeeded", "failed"],
        note: str,
        actor: str,
        result: Any = None,
    ) -> TurnWritten:
        """Record the real outcome of a call whose outcome is unknown."""
        return await self._send(
            calls.resolve_tool_call(session_id, call_id, outcome, result, note, actor)
        )

    async def cancel_turn(
        self,
        session_id: SessionRef,
        turn_id: str,
        *,
        reason: str,
        actor: str,
        force: bool = False,
    ) -> CancelWritten:
        """Stop a turn: at once if queued or awaiting approval, else at its next step."""
        return await self._send(calls.cancel_turn(session_id, turn_id, reason, actor, force))

    async def approve_call(
        self,
        session_id: SessionRef,
        call_id: str,
        *,
        actor: str,
        note: str = "",
        arguments: dict[str, Any] | None = None,
    ) -> TurnWritten:
        """Let a proposed tool call start, optionally with edited arguments."""
        return await self._send(calls.approve_call(session_id, call_id, actor, note, arguments))

    async def reject_call(
        self, session_id: SessionRef, call_id: str, *, actor: str, reason: str
    ) -> TurnWritten:
        """Refuse a proposed tool call; the model is told the reason."""
        return await self._send(calls.reject_call(session_id, call_id, actor, reason))

    # --------------------------------------------------------------- events

    async def events(
        self, session_id: SessionRef, *, after: int = 0, limit: int = 100
    ) -> EventsPage:
        """One page of the session's stored events after version ``after``."""
        return await self._send(calls.events(session_id, after, limit))

    async def follow(
        self,
        session_id: SessionRef,
        *,
        after: int = 0,
        deltas: bool = False,
        reconnect_for: float = 30.0,
    ) -> AsyncIterator[Event | Delta]:
        """The session's events after version ``after``, then live ones, for ever.

        A dropped connection is resumed with ``Last-Event-ID``: no event is
        lost or repeated. With ``deltas`` the pieces of a model reply that is
        still streaming come too (``Delta``; live only, never stored). Raises
        ``ServerUnreachable`` when no connection succeeds for ``reconnect_for`` s.
        """
        last, down_since = after, None
        while True:
            try:
                async for item in self._stream_once(session_id, last, deltas):
                    down_since = None
                    if isinstance(item, Event):
                        last = item.version
                    yield item
            except httpx.TransportError:
                pass
            except ApiError as exc:
                if exc.status not in calls.RETRY_STATUSES:
                    raise
            now = time.monotonic()
            down_since = down_since or now
            if now - down_since > reconnect_for:
                raise ServerUnreachable(
                    f"event stream of {session_id}: no connection for {reconnect_for:g}s"
                )
            await asyncio.sleep(self.retry.delay(1))

    async def _stream_once(
        self, session_id: SessionRef, last: int, deltas: bool
    ) -> AsyncIterator[Event | Delta]:
        timeout = httpx.Timeout(self.timeout, read=60.0)  # heartbeats come every 15 s
        headers = calls.stream_headers(last)
        async with self._http.stream(
            "GET", calls.stream_path(session_id), headers=headers, timeout=timeout
        ) as response:
            if response.status_code >= 400:
                await response.aread()
                raise calls.problem_of(response)
            calls.check_stream(response)
            async for sse in EventSource(response).aiter_sse():
                frame = calls.frame_of(sse)
                if frame is None:
                    continue
                item = calls.item_of(frame, last, deltas)
                if item is not None:
                    if isinstance(item, Event):
                        last = item.version
                    yield item

    # ---------------------------------------------------------- read models

    async def open_turns(
        self,
        *,
        state: OpenTurnState | None = None,
        limit: int = 50,
        cursor: str | None = None,
        min_position: int | None = None,
    ) -> Page[OpenTurnRow]:
        return await self._send(calls.open_turns(state, limit, cursor, min_position))

    async def tool_calls(
        self,
        *,
        status: str | None = None,
        session_id: SessionRef | None = None,
        tool: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        min_position: int | None = None,
    ) -> Page[ToolCallRow]:
        return await self._send(
            calls.tool_calls(status, session_id, tool, limit, cursor, min_position)
        )

    async def get_request(self, session_id: SessionRef, version: int) -> ModelRequest:
        """The model request the runtime would have sent at ``version`` (incident review)."""
        return await self._send(calls.get_request(session_id, version))

    async def open_turns_summary(self, *, min_position: int | None = None) -> OpenTurnsSummary:
        """Open turns counted by state, with the oldest of each."""
        return await self._send(calls.open_turns_summary(min_position))

    async def tool_call_activity(
        self,
        *,
        window_seconds: float | None = None,
        buckets: int | None = None,
        min_position: int | None = None,
    ) -> ToolCallActivity:
        """Tool calls requested in a recent window (default: an hour), by state and bucket."""
        return await self._send(calls.tool_call_activity(window_seconds, buckets, min_position))

    async def health(self) -> Health:
        """Whether the process answers (``/healthz``)."""
        return await self._send(calls.health())

    async def ready(self) -> Ready:
        """Whether the process serves its role (``/readyz``); not ready raises ``ApiError`` 503."""
        return await self._send(calls.ready())

    async def metrics(self) -> str:
        """The Prometheus metrics text (``/metrics``)."""
        return (await self._send(calls.metrics())).text

    async def workers(self) -> Workers:
        return await self._send(calls.workers())

    async def projections(self) -> Projections:
        return await self._send(calls.projections())

    async def whoami(self) -> Whoami:
        """The namespace and role this client's token reaches, and the namespace's quotas."""
        return await self._send(calls.whoami())
