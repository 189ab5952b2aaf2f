"""Request and response bodies of the HTTP API, named by their role.

Responses mirror ``application.views`` (plain dicts rebuilt from events);
requests are strict (unknown fields are refused) so a typo never passes
silently.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

TurnStateName = Literal[
    "queued",
    "running",
    "completed",
    "failed",
    "interrupted",
    "abandoned",
    "cancelled",
    "awaiting_approval",
]
CallStateName = Literal[
    "pending",
    "started",
    "succeeded",
    "failed",
    "unknown",
    "resolved",
    "abandoned",
    "proposed",
    "rejected",
    "cancelled",
]
SessionStatusName = Literal["idle", "busy", "blocked", "awaiting_approval", "closed"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ------------------------------------------------------------------ requests


class CreateSessionRequest(Strict):
    """A new session. Omitted provider, model and tools take the server's defaults."""

    title: str = Field("", max_length=500, description="A title to find the session by.")
    system_prompt: str = Field("", max_length=64 * 1024, description="Sent first in every request.")
    provider: str | None = Field(None, max_length=100, description="Model provider name.")
    model: str | None = Field(None, max_length=200, description="Model name.")
    tools: list[str] | None = Field(
        None,
        max_length=100,
        description="Tools the model may call ([]: none). Default: TURNLOG_DEFAULT_TOOLS, or"
        " every tool for the fixture provider and all but the demo tools (echo, sleep,"
        " append_file) for a real one.",
    )
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="Free-form; keys starting with 'turnlog.' are reserved."
    )
    created_by: str = Field("", max_length=200, description="Who asked for the session.")
    context: ContextPolicyIn | None = Field(
        None,
        description="Context-window policy: when a request would exceed it, the oldest turns"
        " are summarised first. Omitted: the server's default (TURNLOG_CONTEXT_MAX_*).",
    )
    approval_policy: Literal["none", "side_effecting", "all"] | None = Field(
        None,
        description="Which tool calls wait for an operator's approval: none, those of"
        " side-effecting tools, or all. Omitted: TURNLOG_APPROVAL_POLICY.",
    )
    deadline_seconds: float | None = Field(
        None,
        strict=True,
        description="Default deadline of the session's turns, in seconds (at most 7 days)."
        " Omitted: TURNLOG_TURN_DEADLINE_SECONDS, or none.",
    )


class ContextPolicyIn(Strict):
    """A session's context-window policy; a limit left out or null is not set."""

    max_turns: int | None = Field(
        None,
        ge=1,
        strict=True,
        description="At most this many turns after the latest summary in a request.",
    )
    max_chars: int | None = Field(
        None,
        ge=1000,
        strict=True,
        description="A request longer than this many characters first has its oldest turns"
        " summarised.",
    )


class SubmitTurnRequest(Strict):
    """A user message; it becomes a queued turn."""

    message: str = Field(description="The user message (1 byte to 64 KiB).")
    deadline_seconds: float | None = Field(
        None,
        strict=True,
        description="Cancel the turn (reason `deadline`) this many seconds after submission"
        " (more than 0, at most 7 days). Omitted: the session's default, then the server's.",
    )


class CancelTurnRequest(Strict):
    """Stop a turn: at once if queued or awaiting approval, at its next step if running."""

    reason: str = Field(min_length=1, max_length=2000, description="Why (recorded).")
    actor: str = Field(min_length=1, max_length=200, description="Who decides (recorded).")
    force: bool = Field(
        False,
        strict=True,
        description="Also kill a side-effecting call in flight; its outcome becomes unknown"
        " and the turn is interrupted.",
    )


class ApproveToolCallRequest(Strict):
    """Let a proposed tool call start, optionally with edited arguments."""

    actor: str = Field(min_length=1, max_length=200, description="Who decides (recorded).")
    note: str = Field("", max_length=2000, description="Why (recorded).")
    arguments: dict[str, Any] | None = Field(
        None, description="Edited arguments, checked against the tool's schema (omitted: as asked)."
    )


class RejectToolCallRequest(Strict):
    """Refuse a proposed tool call; the model is told the reason."""

    actor: str = Field(min_length=1, max_length=200, description="Who decides (recorded).")
    reason: str = Field(min_length=1, max_length=2000, description="Why (recorded).")


class AbandonTurnRequest(Strict):
    """An operator gives up an interrupted turn; its unknown calls stay unknown."""

    reason: str = Field(min_length=1, max_length=2000, description="Why (recorded).")
    actor: str = Field(min_length=1, max_length=200, description="Who decides (recorded).")


class ResolveToolCallRequest(Strict):
    """An operator records the real outcome of a call whose outcome is unknown."""

    outcome: Literal["succeeded", "failed"] = Field(description="What really happened.")
    result: Any = Field(None, description="The call's real result (any JSON value).")
    note: str = Field(min_length=1, max_length=2000, description="How it was established.")
    actor: str = Field(min_length=1, max_length=200, description="Who decides (recorded).")


class ForkSessionRequest(Strict):
    """A new session that goes on from this one as it was at ``version``."""

    version: int = Field(
        strict=True, description="The source's version to fork at: between turns (1 to its latest)."
    )
    title: str | None = Field(None, max_length=500, description="Omitted: the source's title.")
    metadata: dict[str, Any] | None = Field(
        None,
        description="Omitted: the source's metadata. Keys starting with 'turnlog.' are reserved.",
    )
    created_by: str = Field("", max_length=200, description="Who asked for the fork.")


class CloseSessionRequest(Strict):
    """Close a session: it takes no more turns."""

    reason: str = Field("", max_length=2000, description="Why (recorded).")
    actor: str = Field(min_length=1, max_length=200, description="Who decides (recorded).")


# ----------------------------------------------------------------- responses


class StepOut(BaseModel):
    """One model reply within a turn."""

    step: int
    text: str
    call_ids: list[str]
    usage: dict[str, Any]


class ProbeRunOut(BaseModel):
    """One run of a tool's probe: its answer, what it saw, how long it took, who asked."""

    attempt: int
    answer: Literal["applied", "not_applied", "unknown"]
    evidence: dict[str, Any]
    note: str
    duration_seconds: float
    prober: str
    at: datetime | None = None


class ToolCallOut(BaseModel):
    """A tool call with its arguments, attempts, owner and outcome."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    step: int
    state: CallStateName
    effect: str
    attempt: int
    worker_id: str
    started_at: datetime | None
    finished_at: datetime | None
    result: Any = None
    error: str
    outcome: str
    note: str
    actor: str
    approval: str = Field("", description="'' (none asked), required, approved or rejected.")
    proposed_arguments: dict[str, Any] | None = Field(
        None, description="What the model asked for, when approved with edited arguments."
    )
    pre_state: dict[str, Any] = Field(
        default_factory=dict, description="What the intent recorded for the tool's probe."
    )
    probes: list[ProbeRunOut] = Field(
        default_factory=list, description="Each run of the tool's probe after its owner died."
    )
    evidence: dict[str, Any] = Field(
        default_factory=dict, description="What the probe saw, for a call it resolved."
    )


class TurnOut(BaseModel):
    """One user message and everything done to answer it."""

    turn_id: str
    state: TurnStateName
    message: str
    reply: str
    error: str
    idempotency_key: str
    submitted_at: datetime | None
    state_since: datetime | None
    claim: int
    worker_id: str
    previous_worker: str
    reason: str
    actor: str
    steps: list[StepOut]
    tool_calls: list[ToolCallOut]
    unknown_call_ids: list[str]
    deadline_at: datetime | None = Field(None, description="When the runtime cancels it.")
    cancel_reason: str = Field("", description="A cancel asked while it ran (its owner acts).")
    cancel_force: bool = False


class ContextPolicyOut(BaseModel):
    """A session's context-window policy (null: that limit is not set)."""

    max_turns: int | None
    max_chars: int | None


class CompactionOut(BaseModel):
    """The latest context summary: it stands for the session's first ``turns`` turns."""

    summary: str
    turns: int
    last_turn_id: str
    version: int = Field(description="Version of its ContextCompacted event.")


class LastTurnOut(BaseModel):
    """The session's latest turn: its id and state."""

    turn_id: str
    state: TurnStateName


class ForkedFromOut(BaseModel):
    """A fork's source: its id, the version forked at, its chain head there (hex; '' unchained)."""

    session_id: UUID
    version: int
    head: str


class SessionOut(BaseModel):
    """A session rebuilt from its events: settings, status, turn counts, the open turn.

    Its size does not grow with the session's history; the turns are paged at
    ``GET /v1/sessions/{id}/turns``.
    """

    session_id: UUID
    title: str
    status: SessionStatusName
    provider: str
    model: str
    tools: list[str]
    metadata: dict[str, Any]
    created_by: str
    created_at: datetime | None
    last_activity_at: datetime | None
    version: int
    closed: bool
    context: ContextPolicyOut
    compaction: CompactionOut | None
    turn_count: int = Field(description="Turns submitted to the session, open ones included.")
    turn_counts: dict[TurnStateName, int] = Field(description="Turns by state.")
    last_turn: LastTurnOut | None
    open_turn: TurnOut | None = Field(
        description="The current turn: queued, running, awaiting approval or interrupted."
    )
    queued_turns: list[QueuedTurnOut] = Field(
        default_factory=list, description="Follow-ups queued behind it, in the order they run."
    )
    approval_policy: str = "none"
    deadline_seconds: float | None = Field(None, description="Default deadline of its turns.")
    forked_from: ForkedFromOut | None = Field(
        None, description="The session and version it was forked from (null: not a fork)."
    )


class QueuedTurnOut(BaseModel):
    """A follow-up turn waiting behind the session's current one."""

    turn_id: str
    message: str
    submitted_at: datetime | None
    deadline_at: datetime | None


class SessionWritten(SessionOut):
    """A session after a write, with the log position of the write's last event."""

    position: int | None = Field(description="Log position; pass as ?min_position to lists.")


class TurnWritten(TurnOut):
    """A turn after a write, with its session and the log position of the write."""

    session_id: UUID
    position: int | None = Field(description="Log position; pass as ?min_position to lists.")


class CancelWritten(TurnWritten):
    """A turn after a cancel: cancelled at once, or a request its owner acts on."""

    cancel: Literal["cancelled", "requested"]


class RequestMessageOut(BaseModel):
    role: str
    content: str
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    tool_call_id: str = ""
    name: str = ""


class ModelRequestOut(BaseModel):
    """The request the runtime would have sent to the provider at a session's version."""

    session_id: UUID
    version: int
    provider: str
    model: str
    turn: int = Field(description="The session's number of the turn it is for (0: not said).")
    tools: list[str]
    tools_chosen: bool
    messages: list[RequestMessageOut]


class EventOut(BaseModel):
    """One stored event as it is in the log."""

    position: int = Field(description="Global log position (notification id).")
    version: int = Field(description="Version of the session after this event.")
    type: str
    topic: str
    timestamp: datetime
    payload: dict[str, Any]


class EventsPage(BaseModel):
    """A page of a session's events; ask again with ``after=next_after`` for more."""

    session_id: UUID
    events: list[EventOut]
    next_after: int


class HealthOut(BaseModel):
    status: Literal["ok"]


class ReadyOut(BaseModel):
    status: Literal["ready"]
    role: str
    checks: dict[str, bool]
    sandbox: str = "on"  # or "off: …", "unavailable: why" (docs/containment.md)
    horizon: dict[str, Any] | None = Field(
        default=None,
        description="The commit horizon readers of the log wait behind: age_seconds of the"
        " oldest running transaction in the cluster, its server pid, database and"
        " application_name (pid null: none holds readers back).",
    )


class ProblemOut(BaseModel):
    """An RFC 9457 problem; ``code`` is stable, extra members depend on the code."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str
    code: str
    request_id: str | None = None


_DESCRIPTIONS = {
    401: "Missing or wrong bearer token (`unauthorized`).",
    403: "The token's role does not allow this route (`role_forbidden`; a tenants file).",
    404: "No such session, turn or tool call.",
    409: "The session's state forbids this (`turn_in_progress`, `unresolved_turn`, "
    "`session_closed`, `idempotency_key_reused`, `invalid_transition`, …).",
    410: "The session was purged (`session_purged`): its events are gone, a record stays.",
    413: "Body over 1 MiB (`payload_too_large`).",
    422: "Invalid input (`validation_error`, `invalid_message`, `invalid_operator_action`).",
    429: "The namespace's quota would be passed (`quota_exceeded`); see Retry-After.",
    503: "Database unreachable, read model lagging or server starting; see Retry-After.",
}


def problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the problems a route can answer with.

    A route that answers 404 for an unknown session answers 410 for a purged one,
    and one behind the token may answer 403 for a role that does not allow it.
    """
    if 404 in statuses and 410 not in statuses:
        statuses = (*statuses, 410)
    if 401 in statuses and 403 not in statuses:
        statuses = (*statuses, 403)  # a token's role (a tenants file) can refuse any route
    return {s: {"model": ProblemOut, "description": _DESCRIPTIONS[s]} for s in statuses}
