"""The ``open_turns`` read model: one row per turn that is queued, running or interrupted.

A turn's row goes when it completes, fails or is abandoned. Workers look for
work here; operators look for interrupted turns and their unknown calls.
"""

from __future__ import annotations

from typing import Any

from eventsourcing.dispatch import singledispatchmethod
from eventsourcing.persistence import Tracking
from eventsourcing.projection import Projection

from turnlog.domain.session import Session
from turnlog.domain.turns import TurnState
from turnlog.projections.rows import Row, Table, turn_scope
from turnlog.projections.view import PostgresReadModelView, ReadModelView

STATES = (
    TurnState.QUEUED.value,
    TurnState.RUNNING.value,
    TurnState.INTERRUPTED.value,
    TurnState.AWAITING_APPROVAL.value,
)

TABLE = Table(
    columns=(
        ("session_id", "uuid"),
        ("turn_id", "text"),
        ("state", "text"),
        ("claim", "integer"),
        ("worker_id", "text"),
        ("previous_worker", "text"),
        ("unknown_call_ids", "text[]"),
        ("submitted_at", "timestamptz"),
        ("submitted_position", "bigint"),
        ("state_since", "timestamptz"),
        ("proposed_call_ids", "text[]"),  # calls waiting for an operator's approval
        ("deadline_at", "timestamptz"),
    ),
    key=("session_id", "turn_id"),
    scope=("session_id", "turn_id"),
    scope_of=turn_scope,
    indexes=(("submitted_position",), ("state", "submitted_position")),
)


class PostgresOpenTurnsView(PostgresReadModelView):
    """The open-turns table in PostgreSQL, and its list query."""

    table = TABLE

    def list_open_turns(self, state: str | None, limit: int, after: int | None) -> list[Row]:
        """Open turns in submission order, oldest first."""
        return self.select(
            {"state": state} if state else {},
            ("submitted_position",),
            descending=False,
            after=None if after is None else (after,),
            limit=limit,
        )


class OpenTurnsProjection(Projection[ReadModelView]):
    """Keeps a row for each open turn, following the aggregate's turn states."""

    name = "open_turns_view"

    @singledispatchmethod
    def process_event(self, domain_event: Any, tracking: Tracking) -> None:
        """Events that do not change a turn's state are tracked all the same."""
        self.view.insert_tracking(tracking)

    @process_event.register
    def _(self, event: Session.TurnSubmitted, tracking: Tracking) -> None:
        with self.view.change(event, tracking) as rows:
            rows.put(
                {
                    "session_id": event.originator_id,
                    "turn_id": event.turn_id,
                    "state": TurnState.QUEUED.value,
                    "claim": 0,
                    "worker_id": "",
                    "previous_worker": "",
                    "unknown_call_ids": [],
                    "submitted_at": event.timestamp,
                    "submitted_position": tracking.notification_id,
                    "state_since": event.timestamp,
                    "proposed_call_ids": [],
                    "deadline_at": event.deadline_at,
                }
            )

    @process_event.register
    def _(self, event: Session.TurnClaimed, tracking: Tracking) -> None:
        with self.view.change(event, tracking) as rows:
            rows.update(
                (event.originator_id, event.turn_id),
                state=TurnState.RUNNING.value,
                claim=event.claim,
                worker_id=event.worker_id,
                state_since=event.timestamp,
            )

    @process_event.register
    def _(self, event: Session.TurnInterrupted, tracking: Tracking) -> None:
        with self.view.change(event, tracking) as rows:
            rows.update(
                (event.originator_id, event.turn_id),
                state=TurnState.INTERRUPTED.value,
                worker_id="",
                previous_worker=event.previous_worker,
                unknown_call_ids=list(event.call_ids),
                state_since=event.timestamp,
            )

    @process_event.register
    def _(self, event: Session.ToolCallResolved, tracking: Tracking) -> None:
        key = (event.originator_id, event.turn_id)
        with self.view.change(event, tracking) as rows:
            row = rows.get(key)
            if row is None:
                return
            remaining = [c for c in row["unknown_call_ids"] if c != event.call_id]
            if remaining:
                rows.update(key, unknown_call_ids=remaining)
            else:
                # Every outcome is known again: the turn waits for a new owner.
                rows.update(
                    key,
                    state=TurnState.RUNNING.value,
                    worker_id="",
                    unknown_call_ids=[],
                    state_since=event.timestamp,
                )

    @process_event.register
    def _(self, event: Session.ToolCallProposed, tracking: Tracking) -> None:
        key = (event.originator_id, event.turn_id)
        with self.view.change(event, tracking) as rows:
            row = rows.get(key)
            if row is None:
                return
            rows.update(
                key,
                state=TurnState.AWAITING_APPROVAL.value,
                worker_id="",
                proposed_call_ids=[*(row.get("proposed_call_ids") or []), event.call_id],
                state_since=event.timestamp,
            )

    @process_event.register(Session.ToolCallApproved)
    @process_event.register(Session.ToolCallRejected)
    def _(self, event: Any, tracking: Tracking) -> None:
        key = (event.originator_id, event.turn_id)
        with self.view.change(event, tracking) as rows:
            row = rows.get(key)
            if row is None:
                return
            remaining = [c for c in row.get("proposed_call_ids") or [] if c != event.call_id]
            if remaining:
                rows.update(key, proposed_call_ids=remaining)
            else:
                # No call waits any more: the turn runs again, for a new owner.
                rows.update(
                    key,
                    state=TurnState.RUNNING.value,
                    proposed_call_ids=[],
                    state_since=event.timestamp,
                )

    @process_event.register(Session.TurnCompleted)
    @process_event.register(Session.TurnFailed)
    @process_event.register(Session.TurnAbandoned)
    @process_event.register(Session.TurnCancelled)
    def _(self, event: Any, tracking: Tracking) -> None:
        with self.view.change(event, tracking) as rows:
            rows.delete((event.originator_id, event.turn_id))
