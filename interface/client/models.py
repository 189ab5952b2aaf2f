"""The client's typed responses: the HTTP API's response schemas, as the client reads them.

They have the fields, types and required members of the schemas that
``/openapi.json`` publishes (``OPENAPI_NAMES`` says which is which, and a test
holds them together). Members a newer server adds are kept, not refused.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Generic, Literal, TypeVar
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

T = TypeVar("T")

TurnState = Literal[
    "queued",
    "running",
    "completed",
    "failed",
    "interrupted",
    "abandoned",
    "cancelled",
    "awaiting_approval",
]
CallState = Literal[
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
SessionStatus = Literal["idle", "busy", "blocked", "awaiting_approval", "closed"]
OpenTurnState = Literal["queued", "running", "interrupted", "awaiting_approval"]


class Model(BaseModel):
    """Base of every response: members a newer server adds are kept, not refused."""

    model_config = ConfigDict(extra="allow")


class Step(Model):
    """One model reply within a turn."""

    step: int
    text: str
    call_ids: list[str]
    usage: dict[str, Any]


class ProbeRun(Model):
    """One run of a tool's probe: its answer, what it saw, how long it took, who asked."""

    attempt: int
    answer: Literal["applied", "not_applied", "unknown"]
    evidence: dict[str, Any]
    note: str
    duration_seconds: float
    prober: str
    at: datetime | None = None


class ToolCall(Model):
    """A tool call with its arguments, attempts, owner and outcome."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    step: int
    state: CallState
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
    probes: list[ProbeRun] = Field(
        default_factory=list, description="Each run of the tool's probe after its owner died."
    )
    evidence: dict[str, Any] = Field(
        default_factory=dict, description="What the probe saw, for a call it resolved."
    )


class Turn(Model):
    """One user message and everything done to answer it."""

    turn_id: str
    state: TurnState
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
    steps: list[Step]
    tool_calls: list[ToolCall]
    unknown_call_ids: list[str]
    deadline_at: datetime | None = Field(None, description="When the runtime cancels it.")
    cancel_reason: str = Field("", description="A cancel asked while it ran (its owner acts).")
    cancel_force: bool = False

    @property
    def finished(self) -> bool:
        """Whether the turn has stopped moving on its own (completed, failed, interrupted …)."""
        return self.state not in ("queued", "running")


class ContextPolicy(Model):
    """A session's context-window policy (None: that limit is not set)."""

    max_turns: int | None
    max_chars: int | None


class Compaction(Model):
    """The latest context summary: it stands for the session's first ``turns`` turns."""

    summary: str
    turns: int
    last_turn_id: str
    version: int = Field(description="Version of its ContextCompacted event.")


class LastTurn(Model):
    """The session's latest turn: its id and state."""

    turn_id: str
    state: TurnState


class ForkedFrom(Model):
    """A fork's source: its id, the version forked at, its chain head there (hex; '' unchained)."""

    session_id: UUID
    version: int
    head: str


class Session(Model):
    """A session rebuilt from its events: settings, status, turn counts, the open turn.

    Its turns are paged (``list_turns``), newest first.
    """

    session_id: UUID
    title: str
    status: SessionStatus
    provider: str
    model: str
    tools: list[str]
    metadata: dict[str, Any]
    created_by: str
    created_at: datetime | None
    last_activity_at: datetime | None
    version: int
    closed: bool
    context: ContextPolicy
    compaction: Compaction | None
    turn_count: int = Field(description="Turns submitted to the session, open ones included.")
    turn_counts: dict[TurnState, int] = Field(description="Turns by state.")
    last_turn: LastTurn | None
    open_turn: Turn | None = Field(
        description="The current turn: queued, running, awaiting approval or interrupted."
    )
    queued_turns: list[QueuedTurn] = Field(
        default_factory=list, description="Follow-ups queued behind it, in the order they run."
    )
    approval_policy: str = "none"
    deadline_seconds: float | None = Field(None, description="Default deadline of its turns.")
    forked_from: ForkedFrom | None = Field(
        None, description="The session and version it was forked from (null: not a fork)."
    )


class QueuedTurn(Model):
    """A follow-up turn waiting behind the session's current one."""

    turn_id: str
    message: str
    submitted_at: datetime | None
    deadline_at: datetime | None


class SessionWritten(Session):
    """A session after a write, with the log position of the write's last event."""

    position: int | None = Field(description="Log position; pass as min_position to lists.")


class TurnWritten(Turn):
    """A turn after a write, with its session and the log position of the write."""

    session_id: UUID
    position: int | None = Field(description="Log position; pass as min_position to lists.")


class CancelWritten(TurnWritten):
    """A turn after a cancel: cancelled at once, or a request its owner acts on."""

    cancel: Literal["cancelled", "requested"]


class Event(Model):
    """One stored event as it is in the log."""

    position: int
    version: int
    type: str
    topic: str
    timestamp: datetime
    payload: dict[str, Any]


class Delta(Model):
    """A piece of a model reply while it streams: live only, never stored or replayed."""

    session_id: UUID
    turn_id: str
    step: int
    text: str


class EventsPage(Model):
    """A page of a session's events; ask again with ``after=next_after`` for more."""

    session_id: UUID
    events: list[Event]
    next_after: int


class Page(Model, Generic[T]):
    """A page of a read model; ``next_cursor`` is None on the last page."""

    items: list[T]
    next_cursor: str | None


class SessionRow(Model):
    """A session as the sessions read model lists it."""

    session_id: UUID
    title: str | None
    status: SessionStatus
    closed: bool
    turn_count: int
    last_turn_id: str | None
    last_turn_state: TurnState | None
    unknown_call_ids: list[str] | None
    created_by: str | None
    created_at: datetime | None
    last_activity_at: datetime | None
    last_position: int
    version: int
    metadata: dict[str, Any] | None = Field(
        None,
        description="Its metadata (null in rows folded before the column: a rebuild fills it).",
    )
    forked_from: UUID | None = Field(None, description="A fork's source (null: not a fork).")


class OpenTurnRow(Model):
    """An open turn as the open-turns read model lists it."""

    session_id: UUID
    turn_id: str
    state: OpenTurnState
    claim: int | None
    worker_id: str | None
    previous_worker: str | None
    unknown_call_ids: list[str] | None
    submitted_at: datetime | None
    submitted_position: int
    state_since: datetime | None
    proposed_call_ids: list[str] | None = None
    deadline_at: datetime | None = None


class ToolCallRow(Model):
    """A tool call as the tool-call read model lists it."""

    session_id: UUID
    call_id: str
    turn_id: str
    step: int | None
    tool: str
    effect: str | None
    state: CallState
    attempt: int | None
    worker_id: str | None
    outcome: str | None
    requested_at: datetime | None
    requested_position: int
    started_at: datetime | None
    finished_at: datetime | None
    duration_seconds: float | None
    result_summary: str | None
    error_summary: str | None


class Worker(Model):
    """A registered worker process."""

    worker_id: str
    pid: int
    host: str
    started_at: datetime | None
    heartbeat_at: datetime | None
    stopped_at: datetime | None = None


class Projection(Model):
    """Where a read model stands in the log."""

    name: str
    position: int
    head: int
    lag_events: int
    lag_seconds: float | None
    running: bool
    holder: str | None


class Whoami(Model):
    """The namespace and role a token reaches (``GET /v1/whoami``)."""

    namespace: str
    role: str
    token: str | None
    namespaces: list[str]
    quotas: dict[str, int]


class Workers(Model):
    items: list[Worker]


class Projections(Model):
    items: list[Projection]


class PurgeRecord(Model):
    """What stays of a purged session: who, why, when, and what existed."""

    session_id: UUID
    state: str
    actor: str
    reason: str
    requested_at: datetime
    completed_at: datetime | None
    events: int | None
    head_version: int | None
    head_hash: str | None = Field(description="Hex hash of its last event: its chain's head.")
    last_position: int | None


# Each model and the /openapi.json schema it reads (tests/api/test_client_models.py).
class RequestMessage(Model):
    """One message of a model request."""

    role: str
    content: str
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    tool_call_id: str = ""
    name: str = ""


class ModelRequest(Model):
    """The request the runtime would have sent to the provider at a session's version."""

    session_id: UUID
    version: int
    provider: str
    model: str
    turn: int = Field(description="The session's number of the turn it is for (0: not said).")
    tools: list[str]
    tools_chosen: bool
    messages: list[RequestMessage]


class OpenTurnStateCount(Model):
    """How many turns are open in one state, and since when the oldest of them."""

    state: OpenTurnState
    count: int
    oldest_submitted_at: datetime | None


class OpenTurnsSummary(Model):
    """Open turns by state (from the open-turns read model)."""

    items: list[OpenTurnStateCount]


class ActivityBucket(Model):
    """Tool calls requested within one bucket of the window, by their current state."""

    start: datetime
    by_state: dict[CallState, int]
    total: int


class ToolCallActivity(Model):
    """Tool calls requested in a recent window, by current state, overall and per bucket."""

    since: datetime
    until: datetime
    bucket_seconds: float
    by_state: dict[CallState, int]
    buckets: list[ActivityBucket]


class Health(Model):
    """The process answers (``/healthz``)."""

    status: Literal["ok"]


class Ready(Model):
    """The process serves its role (``/readyz``); a 503 raises ``ApiError`` instead."""

    status: Literal["ready"]
    role: str
    checks: dict[str, bool]
    horizon: dict[str, Any] | None = None
    sandbox: str = Field("on", description="on, or off: … / unavailable: why.")


class Metrics(Model):
    """The Prometheus text exposition of ``/metrics``, as it came."""

    text: str


OPENAPI_NAMES: dict[type[BaseModel], str] = {
    Step: "StepOut",
    ProbeRun: "ProbeRunOut",
    ToolCall: "ToolCallOut",
    Turn: "TurnOut",
    Session: "SessionOut",
    ForkedFrom: "ForkedFromOut",
    SessionWritten: "SessionWritten",
    TurnWritten: "TurnWritten",
    CancelWritten: "CancelWritten",
    QueuedTurn: "QueuedTurnOut",
    Event: "EventOut",
    EventsPage: "EventsPage",
    SessionRow: "SessionRow",
    OpenTurnRow: "OpenTurnRow",
    ToolCallRow: "ToolCallRow",
    ContextPolicy: "ContextPolicyOut",
    Compaction: "CompactionOut",
    LastTurn: "LastTurnOut",
    Page[Turn]: "Page_TurnOut_",
    Page[SessionRow]: "Page_SessionRow_",
    Page[OpenTurnRow]: "Page_OpenTurnRow_",
    Page[ToolCallRow]: "Page_ToolCallRow_",
    Worker: "WorkerOut",
    Workers: "WorkersOut",
    Whoami: "WhoamiOut",
    Projection: "ProjectionOut",
    Projections: "ProjectionsOut",
    PurgeRecord: "PurgeOut",
    RequestMessage: "RequestMessageOut",
    ModelRequest: "ModelRequestOut",
    OpenTurnStateCount: "OpenTurnStateOut",
    OpenTurnsSummary: "OpenTurnsSummaryOut",
    ActivityBucket: "ActivityBucketOut",
    ToolCallActivity: "ToolCallActivityOut",
    Health: "HealthOut",
    Ready: "ReadyOut",
}
