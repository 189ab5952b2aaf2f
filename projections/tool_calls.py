"""The ``tool_calls`` read model: one row per tool call, with its state and timing.

States follow the aggregate: ``pending`` (requested, not started),
``started``, ``succeeded``, ``failed``, ``unknown`` (its owner died inside an
unsafe call), ``resolved`` (an operator recorded the real outcome) and
``abandoned``. Results and errors are kept as short summaries.
"""

from __future__ import annotations

from typing import Any

from eventsourcing.dispatch import singledispatchmethod
from eventsourcing.persistence import Tracking
from eventsourcing.projection import Projection

from turnlog.domain.session import Session
from turnlog.domain.turns import CallState
from turnlog.projections.rows import Row, Rows, Table, seconds_between, summarize, turn_scope
from turnlog.projections.view import PostgresReadModelView, ReadModelView

STATES = tuple(state.value for state in CallState)

TABLE = Table(
    columns=(
        ("session_id", "uuid"),
        ("call_id", "text"),
        ("turn_id", "text"),
        ("step", "integer"),
        ("tool", "text"),
        ("effect", "text"),
        ("state", "text"),
        ("attempt", "integer"),
        ("worker_id", "text"),
        ("outcome", "text"),
        ("requested_at", "timestamptz"),
        ("requested_position", "bigint"),
        ("started_at", "timestamptz"),
        ("finished_at", "timestamptz"),
        ("duration_seconds", "double precision"),
        ("result_summary", "text"),
        ("error_summary", "text"),
    ),
    key=("session_id", "call_id"),
    scope=("session_id", "turn_id"),
    scope_of=turn_scope,
    indexes=(
        ("session_id", "turn_id"),
        ("requested_position", "call_id"),
        ("state", "requested_position", "call_id"),
    ),
)


class PostgresToolCallsView(PostgresReadModelView):
    """The tool-calls table in PostgreSQL, and its list query."""

    table = TABLE

    def list_tool_calls(
        self, filters: dict[str, Any], limit: int, after: tuple[int, str] | None
    ) -> list[Row]:
        """Tool calls, most recently requested first; ``filters``: state, session_id, tool."""
        return self.select(
            filters, ("requested_position", "call_id"), descending=True, after=after, limit=limit
        )


class ToolCallsProjection(Projection[ReadModelView]):
    """Keeps a row for each tool call, following the aggregate's call states."""

    name = "tool_calls_view"

    @singledispatchmethod
    def process_event(self, domain_event: Any, tracking: Tracking) -> None:
        """Events that change no call are tracked all the same."""
        self.view.insert_tracking(tracking)

    @process_event.register
    def _(self, event: Session.ModelReplied, tracking: Tracking) -> None:
        with self.view.change(event, tracking) as rows:
            for call in event.tool_calls:
                rows.put(
                    {
                        "session_id": event.originator_id,
                        "call_id": call["call_id"],
                        "turn_id": event.turn_id,
                        "step": event.step,
                        "tool": call["name"],
                        "effect": "",
                        "state": CallState.PENDING.value,
                        "attempt": 0,
                        "worker_id": "",
                        "outcome": "",
                        "requested_at": event.timestamp,
                        "requested_position": tracking.notification_id,
                        "started_at": None,
                        "finished_at": None,
                        "duration_seconds": None,
                        "result_summary": "",
                        "error_summary": "",
                    }
                )

    @process_event.register
    def _(self, event: Session.ToolCallStarted, tracking: Tracking) -> None:
        with self.view.change(event, tracking) as rows:
            rows.update(
                (event.originator_id, event.call_id),
                state=CallState.STARTED.value,
                attempt=event.attempt,
                worker_id=event.worker_id,
                effect=event.effect,
                started_at=event.timestamp,
                finished_at=None,
                duration_seconds=None,
            )

    @process_event.register
    def _(self, event: Session.ToolCallSucceeded, tracking: Tracking) -> None:
        with self.view.change(event, tracking) as rows:
            _finish(rows, event, CallState.SUCCEEDED, result_summary=summarize(event.result))

    @process_event.register
    def _(self, event: Session.ToolCallFailed, tracking: Tracking) -> None:
        with self.view.change(event, tracking) as rows:
            _finish(rows, event, CallState.FAILED, error_summary=summarize(event.error))

    @process_event.register
    def _(self, event: Session.ToolCallResolved, tracking: Tracking) -> None:
        with self.view.change(event, tracking) as rows:
            _finish(
                rows,
                event,
                CallState.RESOLVED,
                outcome=event.outcome,
                result_summary=summarize(event.result),
            )

    @process_event.register
    def _(self, event: Session.TurnFailed, tracking: Tracking) -> None:
        # As the aggregate does: calls left started or pending fail with the turn.
        with self.view.change(event, tracking) as rows:
            for row in rows.in_scope((event.originator_id, event.turn_id)):
                if row["state"] == CallState.STARTED:
                    _finish_row(rows, row, event, "turn failed: " + event.error)
                elif row["state"] == CallState.PENDING:
                    _finish_row(rows, row, event, "not run: turn failed: " + event.error)

    @process_event.register
    def _(self, event: Session.TurnInterrupted, tracking: Tracking) -> None:
        with self.view.change(event, tracking) as rows:
            for call_id in event.call_ids:
                rows.update((event.originator_id, call_id), state=CallState.UNKNOWN.value)

    @process_event.register
    def _(self, event: Session.TurnAbandoned, tracking: Tracking) -> None:
        # As the aggregate does: its unknown calls are abandoned, and calls it
        # never started fail, so every call of a finished turn is settled.
        with self.view.change(event, tracking) as rows:
            for call_id in event.call_ids:
                rows.update((event.originator_id, call_id), state=CallState.ABANDONED.value)
            for row in rows.in_scope((event.originator_id, event.turn_id)):
                if row["state"] == CallState.PENDING:
                    _finish_row(rows, row, event, "not run: turn abandoned: " + event.reason)

    @process_event.register
    def _(self, event: Session.ToolCallProposed, tracking: Tracking) -> None:
        with self.view.change(event, tracking) as rows:
            rows.update((event.originator_id, event.call_id), state=CallState.PROPOSED.value)

    @process_event.register
    def _(self, event: Session.ToolCallApproved, tracking: Tracking) -> None:
        with self.view.change(event, tracking) as rows:
            rows.update((event.originator_id, event.call_id), state=CallState.PENDING.value)

    @process_event.register
    def _(self, event: Session.ToolCallRejected, tracking: Tracking) -> None:
        with self.view.change(event, tracking) as rows:
            _finish(
                rows,
                event,
                CallState.REJECTED,
                error_summary=summarize("rejected by operator: " + event.reason),
            )

    @process_event.register
    def _(self, event: Session.TurnCancelled, tracking: Tracking) -> None:
        # As the aggregate does: every call of the turn without an outcome is cancelled.
        with self.view.change(event, tracking) as rows:
            for row in rows.in_scope((event.originator_id, event.turn_id)):
                if row["call_id"] in event.call_ids:
                    rows.update(
                        (row["session_id"], row["call_id"]),
                        state=CallState.CANCELLED.value,
                        error_summary=summarize("cancelled: " + event.reason),
                        finished_at=event.timestamp,
                        duration_seconds=seconds_between(row["started_at"], event.timestamp),
                    )


def _finish(rows: Rows, event: Any, state: CallState, **changes: Any) -> None:
    row = rows.get((event.originator_id, event.call_id))
    if row is None:
        return
    rows.update(
        (event.originator_id, event.call_id),
        state=state.value,
        finished_at=event.timestamp,
        duration_seconds=seconds_between(row["started_at"], event.timestamp),
        **changes,
    )


def _finish_row(rows: Rows, row: Row, event: Any, error: str) -> None:
    rows.update(
        (row["session_id"], row["call_id"]),
        state=CallState.FAILED.value,
        error_summary=summarize(error),
        finished_at=event.timestamp,
        duration_seconds=seconds_between(row["started_at"], event.timestamp),
    )
