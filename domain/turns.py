"""The parts of a session's state: turns, model steps and tool calls.

These are plain dataclasses owned by the Session aggregate. They hold only
JSON-friendly values so that snapshots can store them.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from functools import partial
from typing import Any, NamedTuple

MAX_MESSAGE_BYTES = 64 * 1024
MAX_TOOL_ATTEMPTS = 3
MAX_DEADLINE_SECONDS = 7 * 24 * 3600.0  # the longest deadline a turn may be given
MAX_QUEUED_TURNS = 100  # follow-up turns a session may hold queued behind the current one
# Idempotency keys a session remembers: those of its last N keyed submissions,
# and of every turn still open (TURNLOG_IDEMPOTENCY_WINDOW; docs/long-sessions.md).
IDEMPOTENCY_WINDOW = 100
DEADLINE_REASON = "deadline"
RUNTIME_ACTOR = "turnlog"  # the actor of what the runtime decides by itself (deadlines)
APPROVAL_POLICIES = ("none", "side_effecting", "all")


class TurnState(StrEnum):
    """Where a turn is in its life."""

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    ABANDONED = "abandoned"
    CANCELLED = "cancelled"  # stopped by an operator or by its deadline
    AWAITING_APPROVAL = "awaiting_approval"  # a proposed call waits for an operator

    @property
    def is_open(self) -> bool:
        return self in (
            TurnState.QUEUED,
            TurnState.RUNNING,
            TurnState.INTERRUPTED,
            TurnState.AWAITING_APPROVAL,
        )


class CallState(StrEnum):
    """Where a tool call is in its life."""

    PENDING = "pending"  # requested by the model, not started yet
    STARTED = "started"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNKNOWN = "unknown"
    RESOLVED = "resolved"
    ABANDONED = "abandoned"
    PROPOSED = "proposed"  # needs an operator's approval before it may start
    REJECTED = "rejected"  # an operator refused it; it never ran
    CANCELLED = "cancelled"  # not run, or stopped, because its turn was cancelled


class ProbeAnswer(StrEnum):
    """What a tool's probe found out about a call whose owner died mid-call."""

    APPLIED = "applied"  # the call took effect; the probe gives its result
    NOT_APPLIED = "not_applied"  # the call left no effect
    UNKNOWN = "unknown"  # the probe cannot tell (or failed): an operator must


class Effect(StrEnum):
    """What running a tool does to the world, which decides recovery."""

    READ_ONLY = "read_only"
    IDEMPOTENT = "idempotent"
    SIDE_EFFECTING = "side_effecting"

    @property
    def safe_to_repeat(self) -> bool:
        return self is not Effect.SIDE_EFFECTING


@dataclass
class ToolCall:
    """One tool call requested by the model in a step of a turn."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    turn_id: str
    step: int
    state: CallState = CallState.PENDING
    effect: str = ""
    attempt: int = 0
    worker_id: str = ""
    claim: int = 0
    started_at: datetime | None = None
    finished_at: datetime | None = None
    result: Any = None
    error: str = ""
    outcome: str = ""  # for resolved calls: succeeded | failed, as the operator said
    note: str = ""
    actor: str = ""
    # OS processes the call's attempts spawned (ToolCallProcessStarted), so an
    # operator or the sandbox collector can find them after the owner died.
    processes: list[dict[str, Any]] = field(default_factory=list)
    # What the tool recorded in the intent for its probe (e.g. a file's size and
    # inode), the process that owned the attempt, and every probe run (ToolCallProbed).
    pre_state: dict[str, Any] = field(default_factory=dict)
    owner: dict[str, Any] = field(default_factory=dict)
    probes: list[dict[str, Any]] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)  # of a resolution by probe
    # Approval: "" (none asked), "required" (proposed, waiting), "approved", "rejected".
    approval: str = ""
    # The arguments the model asked for, when an operator approved edited ones.
    proposed_arguments: dict[str, Any] | None = None

    @property
    def last_probe(self) -> dict[str, Any] | None:
        """The latest probe run of the attempt in flight, if any."""
        if self.probes and self.probes[-1].get("attempt") == self.attempt:
            return self.probes[-1]
        return None

    @property
    def in_flight(self) -> bool:
        return self.state is CallState.STARTED

    @property
    def settled(self) -> bool:
        """True when the call's outcome is recorded (or explicitly given up)."""
        return self.state in (
            CallState.SUCCEEDED,
            CallState.FAILED,
            CallState.RESOLVED,
            CallState.ABANDONED,
            CallState.REJECTED,
            CallState.CANCELLED,
        )


@dataclass(frozen=True)
class ToolProcess:
    """An OS process a tool call spawned, named so that a reused pid is never mistaken for it.

    ``started_at`` is the kernel's start time of the pid (clock ticks after boot,
    field 22 of /proc/<pid>/stat); ``host`` and ``boot_id`` say where it runs.
    ``server`` names the MCP server when the process is one (it serves every
    call of its worker, and outlives each); empty for a call's own process.
    """

    pid: int
    started_at: int
    host: str = ""
    boot_id: str = ""
    server: str = ""

    def as_dict(self, attempt: int) -> dict[str, Any]:
        return {
            "attempt": attempt,
            "pid": self.pid,
            "process_started_at": self.started_at,
            "host": self.host,
            "boot_id": self.boot_id,
        } | ({"server": self.server} if self.server else {})


@dataclass
class Step:
    """One model reply within a turn."""

    step: int
    text: str
    call_ids: list[str]
    usage: dict[str, Any]


@dataclass
class Turn:
    """One user message and everything done to answer it."""

    turn_id: str
    message: str
    idempotency_key: str
    submitted_at: datetime
    state: TurnState = TurnState.QUEUED
    state_since: datetime | None = None
    claim: int = 0
    worker_id: str = ""
    steps: list[Step] = field(default_factory=list)
    call_ids: list[str] = field(default_factory=list)
    reply: str = ""
    error: str = ""
    reason: str = ""
    actor: str = ""
    previous_worker: str = ""
    interrupted_by: str = ""  # the process whose recovery interrupted it
    unknown_call_ids: list[str] = field(default_factory=list)
    first_version: int = 0  # the session version of its TurnSubmitted (0: not known yet)
    # When the runtime cancels it (reason "deadline"); None: no deadline.
    deadline_at: datetime | None = None
    # A cancel an operator asked for while it ran; its owner acts on it at a step boundary.
    cancel_reason: str = ""
    cancel_actor: str = ""
    cancel_force: bool = False
    # The submitter's W3C trace context (''): the turn's span joins that trace.
    traceparent: str = ""

    def __deepcopy__(self, memo: dict[int, Any]) -> Turn:
        """A copy whose lists are its own; their items are shared.

        Events replace a turn's fields and append to its lists; a step, once
        appended, never changes. Copying an open turn for each command
        (``Session.__deepcopy__``) so costs a fifth of a deep copy.
        """
        clone = copy.copy(self)
        clone.steps = list(self.steps)
        clone.call_ids = list(self.call_ids)
        clone.unknown_call_ids = list(self.unknown_call_ids)
        memo[id(self)] = clone
        return clone

    def cancel_due(self, now: datetime | None) -> str:
        """Why the turn must stop now ('' when it need not): a cancel request or its deadline."""
        if self.cancel_reason:
            return self.cancel_reason
        if now is not None and self.deadline_at is not None and now >= self.deadline_at:
            return DEADLINE_REASON
        return ""


class FinishedEntry(NamedTuple):
    """A session's record of one finished turn, as it keeps (and its snapshot stores) it.

    Stored as a JSON list in this order, as the positional lists of earlier
    versions were, so snapshots of either kind load as these.
    """

    turn_id: str
    state: str
    first_version: int  # of its events (0: not known yet, upcast from a version-1 snapshot)
    last_version: int
    call_ids: list[str]


def entries_from_lists(stored: Iterable[Sequence[Any]]) -> list[FinishedEntry]:
    """The entries of a snapshot's stored lists, each made as ``FinishedEntry._make`` does.

    Without a call per entry (a long session's snapshot holds thousands);
    every list must hold the five fields.
    """
    entries = list(map(_entry, stored))
    if set(map(len, entries)) - {len(FinishedEntry._fields)}:
        raise ValueError("a finished-turn entry without its five fields")
    return entries


_entry = partial(tuple.__new__, FinishedEntry)


@dataclass(frozen=True)
class FinishedTurn:
    """What a session keeps of a finished turn: its id, how it ended, where its events are.

    The turn's content (message, steps, calls, reply) stays in the stream,
    between ``first_version`` and ``last_version`` (0 when not known yet,
    for a turn upcast from a version-1 snapshot).
    """

    turn_id: str
    state: TurnState
    first_version: int
    last_version: int
    call_ids: tuple[str, ...] = ()

    @classmethod
    def from_entry(cls, entry: FinishedEntry) -> FinishedTurn:
        return cls(
            entry.turn_id,
            TurnState(entry.state),
            entry.first_version,
            entry.last_version,
            tuple(entry.call_ids),
        )


def require_text(value: str, what: str, error: type[Exception]) -> str:
    """Return ``value`` stripped, or raise ``error`` when it is blank."""
    text = value.strip() if isinstance(value, str) else ""
    if not text:
        raise error(f"{what} is required")
    return text


def version_span(entries: Sequence[FinishedEntry]) -> tuple[int, int]:
    """The version range holding every event of these finished turns.

    Turns usually finish in the order they were submitted, but a follow-up
    cancelled while queued finishes before the turn ahead of it: take the
    lowest first and the highest last version, not the ends of the list.
    """
    return min(e.first_version for e in entries), max(e.last_version for e in entries)
