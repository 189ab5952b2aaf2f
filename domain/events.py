"""The Session's events: what each records, and how it changes the session's state.

Each has an explicit, versioned ``TOPIC``, so where a class is defined never
reaches the stored record: streams stored while the events were nested in
``Session`` load unchanged (``tests/unit/test_upcasting.py``). The aggregate
(``domain/session.py``) names each as before (``Session.TurnSubmitted``).
"""

from __future__ import annotations

import copy
import hashlib
from datetime import datetime
from typing import Any, cast

from eventsourcing.domain import Aggregate

from turnlog.domain.turns import (
    IDEMPOTENCY_WINDOW,
    CallState,
    FinishedEntry,
    ProbeAnswer,
    Step,
    ToolCall,
    ToolProcess,
    Turn,
    TurnState,
)

# The aggregate an event applies to is a ``domain.session.Session``; it is typed
# ``Any`` here because the aggregate imports its events, never the reverse.
Session = Any

NOT_APPLIED_ERROR = "not applied (probe)"


class Event(Aggregate.Event):
    """Base class of the session's events."""


class TurnSubmitted(Event):
    TOPIC = "turnlog.session.TurnSubmitted.v1"
    turn_id: str
    message: str
    idempotency_key: str
    # When the runtime cancels the turn (absent from older events: no deadline).
    deadline_at: datetime | None = None
    # The submitter's W3C trace context (absent unless one was sent).
    traceparent: str = ""
    # How many keyed submissions the session remembers after this one (older
    # events, stored before the window, load with the default).
    idempotency_window: int = IDEMPOTENCY_WINDOW

    def apply(self, aggregate: Any) -> None:
        s = cast(Session, aggregate)
        s.turns.append(
            Turn(
                turn_id=self.turn_id,
                message=self.message,
                idempotency_key=self.idempotency_key,
                submitted_at=self.timestamp,
                state_since=self.timestamp,
                first_version=self.originator_version,
                deadline_at=self.deadline_at,
                traceparent=self.traceparent,
            )
        )
        if self.idempotency_key:
            remember_key(s, self.idempotency_key, self.turn_id, message_digest(self.message))
            forget_old_keys(s, self.idempotency_window)


class TurnClaimed(Event):
    TOPIC = "turnlog.session.TurnClaimed.v1"
    turn_id: str
    worker_id: str
    claim: int

    def apply(self, aggregate: Any) -> None:
        turn = cast(Session, aggregate).turn(self.turn_id)
        _move(turn, TurnState.RUNNING, self.timestamp)
        turn.claim = self.claim
        turn.worker_id = self.worker_id


class ModelReplied(Event):
    TOPIC = "turnlog.session.ModelReplied.v1"
    turn_id: str
    step: int
    text: str
    tool_calls: list[dict[str, Any]]
    usage: dict[str, Any]

    def apply(self, aggregate: Any) -> None:
        s = cast(Session, aggregate)
        turn = s.turn(self.turn_id)
        ids = [c["call_id"] for c in self.tool_calls]
        turn.steps.append(Step(self.step, self.text, ids, dict(self.usage)))
        for c in self.tool_calls:
            s.calls[c["call_id"]] = ToolCall(
                call_id=c["call_id"],
                name=c["name"],
                arguments=c["arguments"],
                turn_id=self.turn_id,
                step=self.step,
            )
            turn.call_ids.append(c["call_id"])


class ToolCallStarted(Event):
    TOPIC = "turnlog.session.ToolCallStarted.v1"
    turn_id: str
    call_id: str
    attempt: int
    worker_id: str
    claim: int
    effect: str
    # What the probe will need, and the owning process (absent from older events).
    pre_state: dict[str, Any] | None = None
    owner: dict[str, Any] | None = None

    def apply(self, aggregate: Any) -> None:
        call = cast(Session, aggregate).calls[self.call_id]
        call.state = CallState.STARTED
        call.attempt = self.attempt
        call.worker_id = self.worker_id
        call.claim = self.claim
        call.effect = self.effect
        call.started_at = self.timestamp
        call.finished_at = None
        call.pre_state = dict(self.pre_state or {})
        call.owner = dict(self.owner or {})


class ToolCallProcessStarted(Event):
    TOPIC = "turnlog.session.ToolCallProcessStarted.v1"
    turn_id: str
    call_id: str
    attempt: int
    pid: int
    process_started_at: int  # clock ticks after boot: field 22 of /proc/<pid>/stat
    host: str
    boot_id: str
    # The MCP server's name when the process is one (events stored before it have none).
    server: str = ""

    def apply(self, aggregate: Any) -> None:
        call = cast(Session, aggregate).calls[self.call_id]
        process = ToolProcess(
            self.pid, self.process_started_at, self.host, self.boot_id, self.server
        )
        call.processes.append(process.as_dict(self.attempt))


class ToolCallSucceeded(Event):
    TOPIC = "turnlog.session.ToolCallSucceeded.v1"
    turn_id: str
    call_id: str
    attempt: int
    result: Any

    def apply(self, aggregate: Any) -> None:
        call = cast(Session, aggregate).calls[self.call_id]
        call.state = CallState.SUCCEEDED
        call.result = self.result
        call.finished_at = self.timestamp


class ToolCallFailed(Event):
    TOPIC = "turnlog.session.ToolCallFailed.v1"
    turn_id: str
    call_id: str
    attempt: int
    error: str

    def apply(self, aggregate: Any) -> None:
        call = cast(Session, aggregate).calls[self.call_id]
        call.state = CallState.FAILED
        call.error = self.error
        call.finished_at = self.timestamp


class TurnCompleted(Event):
    TOPIC = "turnlog.session.TurnCompleted.v1"
    turn_id: str
    reply: str

    def apply(self, aggregate: Any) -> None:
        turn = cast(Session, aggregate).turn(self.turn_id)
        _move(turn, TurnState.COMPLETED, self.timestamp)
        turn.reply = self.reply
        _finish(cast(Session, aggregate), turn, self.originator_version)


class TurnFailed(Event):
    TOPIC = "turnlog.session.TurnFailed.v1"
    turn_id: str
    error: str

    def apply(self, aggregate: Any) -> None:
        s = cast(Session, aggregate)
        turn = s.turn(self.turn_id)
        _move(turn, TurnState.FAILED, self.timestamp)
        turn.error = self.error
        # A safe call left in flight (attempts used up) or never started ends
        # failed with the turn, so every call of a finished turn is settled.
        for call in s.calls_of(turn):
            if call.state in (CallState.STARTED, CallState.PENDING):
                was_started = call.state is CallState.STARTED
                call.state = CallState.FAILED
                call.error = (
                    "turn failed: " if was_started else "not run: turn failed: "
                ) + self.error
                call.finished_at = self.timestamp
        _finish(s, turn, self.originator_version)


class TurnInterrupted(Event):
    TOPIC = "turnlog.session.TurnInterrupted.v1"
    turn_id: str
    call_ids: list[str]
    previous_worker: str
    interrupted_by: str = ""  # the recovering process (absent from older events)

    def apply(self, aggregate: Any) -> None:
        s = cast(Session, aggregate)
        turn = s.turn(self.turn_id)
        _move(turn, TurnState.INTERRUPTED, self.timestamp)
        turn.previous_worker = self.previous_worker
        turn.interrupted_by = self.interrupted_by
        turn.worker_id = ""
        turn.unknown_call_ids = list(self.call_ids)
        for call_id in self.call_ids:
            s.calls[call_id].state = CallState.UNKNOWN


class ToolCallResolved(Event):
    TOPIC = "turnlog.session.ToolCallResolved.v1"
    turn_id: str
    call_id: str
    outcome: str
    result: Any
    note: str
    actor: str
    # What a probe found (resolutions by ``probe:<tool>``; absent from older events).
    evidence: dict[str, Any] | None = None

    def apply(self, aggregate: Any) -> None:
        s = cast(Session, aggregate)
        call = s.calls[self.call_id]
        call.state = CallState.RESOLVED
        call.outcome = self.outcome
        call.result = self.result
        call.note = self.note
        call.actor = self.actor
        call.evidence = dict(self.evidence or {})
        call.finished_at = self.timestamp
        turn = s.turn(self.turn_id)
        if not s.unknown_calls(turn):
            # Every outcome is known again: the turn waits for a new owner.
            _move(turn, TurnState.RUNNING, self.timestamp)
            turn.worker_id = ""
            turn.unknown_call_ids = []


class TurnAbandoned(Event):
    TOPIC = "turnlog.session.TurnAbandoned.v1"
    turn_id: str
    reason: str
    actor: str
    call_ids: list[str]

    def apply(self, aggregate: Any) -> None:
        s = cast(Session, aggregate)
        turn = s.turn(self.turn_id)
        _move(turn, TurnState.ABANDONED, self.timestamp)
        turn.reason = self.reason
        turn.actor = self.actor
        for call_id in self.call_ids:
            s.calls[call_id].state = CallState.ABANDONED
        # Calls the turn never started will never run either: like TurnFailed,
        # settle them so every call of a finished turn has a known outcome.
        for call in s.calls_of(turn):
            if call.state is CallState.PENDING:
                call.state = CallState.FAILED
                call.error = "not run: turn abandoned: " + self.reason
                call.finished_at = self.timestamp
        _finish(s, turn, self.originator_version)


class CancelRequested(Event):
    """An operator asked the owner of a running turn to stop it (``force``: kill any call)."""

    TOPIC = "turnlog.session.CancelRequested.v1"
    turn_id: str
    reason: str
    actor: str
    force: bool

    def apply(self, aggregate: Any) -> None:
        turn = cast(Session, aggregate).turn(self.turn_id)
        turn.cancel_reason = self.reason
        turn.cancel_actor = self.actor
        turn.cancel_force = self.force


class TurnCancelled(Event):
    """The turn stopped: by an operator, or by the runtime at its deadline."""

    TOPIC = "turnlog.session.TurnCancelled.v1"
    turn_id: str
    reason: str
    actor: str
    call_ids: list[str]  # calls that had no outcome: never run, proposed, or stopped

    def apply(self, aggregate: Any) -> None:
        s = cast(Session, aggregate)
        turn = s.turn(self.turn_id)
        _move(turn, TurnState.CANCELLED, self.timestamp)
        turn.reason = self.reason
        turn.actor = self.actor
        turn.worker_id = ""
        for call_id in self.call_ids:
            call = s.calls[call_id]
            call.state = CallState.CANCELLED
            call.note = self.reason
            call.actor = self.actor
            call.finished_at = self.timestamp
        _finish(s, turn, self.originator_version)


class ToolCallProposed(Event):
    """A call waits for an operator's approval; nothing runs, and no one owns the turn."""

    TOPIC = "turnlog.session.ToolCallProposed.v1"
    turn_id: str
    call_id: str

    def apply(self, aggregate: Any) -> None:
        s = cast(Session, aggregate)
        call = s.calls[self.call_id]
        call.state = CallState.PROPOSED
        call.approval = "required"
        turn = s.turn(self.turn_id)
        _move(turn, TurnState.AWAITING_APPROVAL, self.timestamp)
        turn.worker_id = ""


class ToolCallApproved(Event):
    TOPIC = "turnlog.session.ToolCallApproved.v1"
    turn_id: str
    call_id: str
    actor: str
    note: str
    arguments: dict[str, Any] | None  # edited arguments (None: as proposed)

    def apply(self, aggregate: Any) -> None:
        s = cast(Session, aggregate)
        call = s.calls[self.call_id]
        call.state = CallState.PENDING
        call.approval = "approved"
        call.actor = self.actor
        call.note = self.note
        if self.arguments is not None:
            call.proposed_arguments = call.arguments
            call.arguments = copy.deepcopy(self.arguments)
        _decided(s, self.turn_id, self.timestamp)


class ToolCallRejected(Event):
    TOPIC = "turnlog.session.ToolCallRejected.v1"
    turn_id: str
    call_id: str
    actor: str
    reason: str

    def apply(self, aggregate: Any) -> None:
        s = cast(Session, aggregate)
        call = s.calls[self.call_id]
        call.state = CallState.REJECTED
        call.approval = "rejected"
        call.actor = self.actor
        call.note = self.reason
        call.finished_at = self.timestamp
        _decided(s, self.turn_id, self.timestamp)


class ContextCompacted(Event):
    """A summary of the session's first ``turns`` turns now stands for them in requests.

    The turns it covers stay in the stream; ``replaces`` is the version of
    the summary it supersedes (0: the first), ``produced_by`` the provider
    and model that wrote it, with their usage.
    """

    TOPIC = "turnlog.session.ContextCompacted.v1"
    turn_id: str
    summary: str
    turns: int
    first_turn_id: str
    last_turn_id: str
    through_version: int
    replaces: int
    produced_by: dict[str, Any]

    def apply(self, aggregate: Any) -> None:
        s = cast(Session, aggregate)
        s.compaction = {
            "summary": self.summary,
            "turns": self.turns,
            "last_turn_id": self.last_turn_id,
            "through_version": self.through_version,
            "version": self.originator_version,
        }
        if s.retains_finished:
            s.__dict__.setdefault("compactions", []).append(
                {**s.compaction, "turn_id": self.turn_id, "produced_by": self.produced_by}
            )


class Closed(Event):
    # The topic keeps the class's former name: streams already stored load unchanged.
    TOPIC = "turnlog.session.SessionClosed.v1"
    reason: str
    actor: str

    def apply(self, aggregate: Any) -> None:
        s = cast(Session, aggregate)
        s.closed = True
        s.close_reason = self.reason


class ToolCallProbed(Event):
    """A tool's probe was asked whether an in-flight call took effect; what it answered.

    ``answer``: applied, not_applied or unknown; ``evidence``: what the
    probe saw (for an operator); ``note``: its words (or why it failed);
    ``prober``: the recovering process.
    """

    TOPIC = "turnlog.session.ToolCallProbed.v1"
    turn_id: str
    call_id: str
    attempt: int
    answer: str
    evidence: dict[str, Any]
    note: str
    duration_seconds: float
    prober: str

    def apply(self, aggregate: Any) -> None:
        call = cast(Session, aggregate).calls[self.call_id]
        call.probes.append(
            {
                "attempt": self.attempt,
                "answer": self.answer,
                "evidence": dict(self.evidence),
                "note": self.note,
                "duration_seconds": self.duration_seconds,
                "prober": self.prober,
                "at": self.timestamp.isoformat(),
            }
        )


def probed_not_applied(call: ToolCall) -> bool:
    """True when a probe found the attempt in flight left no effect (it may run again)."""
    probe = call.last_probe if call.state is CallState.STARTED else None
    return probe is not None and probe["answer"] == ProbeAnswer.NOT_APPLIED


def _finish(session: Session, turn: Turn, version: int) -> None:
    """Summarise a turn that has just ended; a bounded session then drops its content."""
    state = str(turn.state)
    session.counts[state] = session.counts.get(state, 0) + 1
    entry = FinishedEntry(turn.turn_id, state, turn.first_version, version, list(turn.call_ids))
    session.finished.append(entry)
    if session.retains_finished:
        return
    session.turns = [t for t in session.turns if t.turn_id != turn.turn_id]
    for call_id in turn.call_ids:
        session.calls.pop(call_id, None)


def remember_key(session: Session, key: str, turn_id: str, digest: str) -> None:
    """Record a submission's key as the newest (a key back after it was forgotten too)."""
    session.idempotency_keys.pop(key, None)
    session.idempotency_digests.pop(key, None)
    session.idempotency_keys[key] = turn_id
    session.idempotency_digests[key] = digest


def forget_old_keys(session: Session, window: int) -> None:
    """Keep the keys of the last ``window`` keyed submissions and of every open turn.

    The dicts keep insertion order (in snapshots too: JSON objects keep it),
    oldest first. A forgotten key names no turn any more: a submission with
    it is a new one.
    """
    keys: dict[str, str] = session.idempotency_keys
    excess = len(keys) - max(1, window)
    if excess <= 0:
        return
    open_ids = {t.turn_id for t in session.turns if t.state.is_open}
    old = [k for k, turn_id in keys.items() if turn_id not in open_ids][:excess]
    for key in old:
        del keys[key]
        session.idempotency_digests.pop(key, None)


def message_digest(message: str) -> str:
    """What idempotency compares a repeated submission with (the message is not kept)."""
    return hashlib.sha256(message.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _decided(session: Session, turn_id: str, at: datetime) -> None:
    """After an approval or a rejection: with no call left waiting, the turn runs again.

    It has no owner; a worker takes it as it takes any turn whose owner is gone.
    """
    turn = session.turn(turn_id)
    if turn.state is TurnState.AWAITING_APPROVAL and not session.proposed_calls(turn):
        _move(turn, TurnState.RUNNING, at)
        turn.worker_id = ""


def _move(turn: Turn, state: TurnState, at: datetime) -> None:
    turn.state = state
    turn.state_since = at
