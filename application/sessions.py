"""The Sessions application: commands over Session aggregates in PostgreSQL.

Every command loads the session, lets the aggregate decide, saves once and
returns ids and the log position of its last event. A save that loses an
optimistic-concurrency race (``IntegrityError``) is retried once on a fresh
load; a second loss surfaces as ``ConcurrentModification``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError, Application, ProcessingEvent
from eventsourcing.persistence import IntegrityError, JSONTranscoder, Transcoding

from turnlog.application.errors import ConcurrentModification, SessionNotFound
from turnlog.domain.session import Session
from turnlog.domain.turns import CallState, Step, ToolCall, Turn, TurnState

T = TypeVar("T")


@dataclass(frozen=True)
class Written:
    """What a command wrote: the session, its new version and the last log position."""

    session_id: UUID
    version: int
    position: int | None  # None when the command wrote nothing (an idempotent repeat)


@dataclass(frozen=True)
class Submitted(Written):
    turn_id: str
    created: bool


class Sessions(Application[UUID]):
    """Event-sourced sessions, stored in the namespace's schema."""

    # Explicit: table names derive from it and must not follow a class rename.
    name = "Sessions"

    def __init__(self, env: dict[str, str] | None = None, snapshot_interval: int = 100) -> None:
        # Per instance: the interval is a setting, not a class constant.
        self.snapshotting_intervals = {Session: snapshot_interval}  # type: ignore[misc]
        super().__init__(env={"IS_SNAPSHOTTING_ENABLED": "y", **(env or {})})

    def _take_snapshots(self, processing_event: ProcessingEvent[UUID]) -> None:
        """Snapshot the sessions just saved, from memory, when a save crosses an interval.

        The library's default reloads the aggregate from the store to snapshot
        it; the object in hand is exactly what was just saved, so use it.
        """
        if self.snapshots is None:
            return
        interval = self.snapshotting_intervals.get(Session)
        if not interval:
            return
        crossed = {
            e.originator_id for e in processing_event.events if e.originator_version % interval == 0
        }
        snapshots = [
            Session.Snapshot.take(aggregate)
            for aggregate_id, aggregate in processing_event.aggregates.items()
            if aggregate_id in crossed and isinstance(aggregate, Session)
        ]
        if snapshots:
            self.snapshots.put(snapshots)

    def register_transcodings(self, transcoder: JSONTranscoder) -> None:
        super().register_transcodings(transcoder)
        for cls in (Turn, ToolCall, Step):
            transcoder.register(_DataclassAsDict(cls))

    # ------------------------------------------------------------------ reads

    def get_session(self, session_id: UUID) -> Session:
        try:
            session: Any = self.repository.get(session_id)
        except AggregateNotFoundError:
            raise SessionNotFound(f"session {session_id} not found") from None
        if not isinstance(session, Session):
            raise SessionNotFound(f"session {session_id} not found")
        return session

    # --------------------------------------------------------------- commands

    def create_session(self, **fields: Any) -> Written:
        """Start a new session; ``fields`` are those of ``Session.start``."""
        session = Session.start(**fields)
        recordings = self.save(session)
        return Written(session.id, session.version, recordings[-1].notification.id)

    def submit_turn(self, session_id: UUID, message: str, idempotency_key: str = "") -> Submitted:
        """Queue a user message as a new turn (or return the turn its key created)."""
        (turn, created), written = self.update(
            session_id, lambda s: s.submit_turn(message, idempotency_key)
        )
        return Submitted(
            written.session_id, written.version, written.position, turn.turn_id, created
        )

    def abandon_turn(self, session_id: UUID, turn_id: str, reason: str, actor: str) -> Written:
        """Give up an interrupted turn."""
        return self.update(session_id, lambda s: s.abandon_turn(turn_id, reason, actor))[1]

    def resolve_tool_call(
        self, session_id: UUID, call_id: str, outcome: str, result: Any, note: str, actor: str
    ) -> tuple[Turn, Written]:
        """Record the real outcome of a call whose outcome was unknown."""
        return self.update(
            session_id, lambda s: s.resolve_tool_call(call_id, outcome, result, note, actor)
        )

    def close_session(self, session_id: UUID, reason: str, actor: str) -> Written:
        """Close a session; it takes no more turns."""
        return self.update(session_id, lambda s: s.close(reason, actor))[1]

    def update(
        self,
        session_id: UUID,
        decide: Callable[[Session], T],
        current: Session | None = None,
    ) -> tuple[T, Written]:
        """Run ``decide`` on the session and save what it recorded.

        On a version conflict the session is reloaded and ``decide`` runs
        again on fresh state, once.
        """
        result, written, _ = self.update_session(session_id, decide, current)
        return result, written

    def update_session(
        self,
        session_id: UUID,
        decide: Callable[[Session], T],
        current: Session | None = None,
    ) -> tuple[T, Written, Session]:
        """Like ``update``, and also returns the session object, now current.

        ``current`` is a session object already at the latest version this
        process knows (the agent loop keeps one between steps): it saves a
        reload. After a conflict it is discarded, since its state already
        holds the events that failed to save.
        """
        for attempt in (1, 2):
            session = current if current is not None else self.get_session(session_id)
            current = None
            result = decide(session)
            if not session.pending_events:
                return result, Written(session.id, session.version, None), session
            try:
                recordings = self.save(session)
            except IntegrityError:
                if attempt == 2:
                    raise ConcurrentModification(
                        f"session {session_id} was changed concurrently; try again"
                    ) from None
                continue
            position = recordings[-1].notification.id
            return result, Written(session.id, session.version, position), session
        raise AssertionError("unreachable")

    def save_session(self, session: Session) -> Written:
        """Save pending events of a session object the caller already holds."""
        recordings = self.save(session)
        position = recordings[-1].notification.id if recordings else None
        return Written(session.id, session.version, position)

    def session_ids(self, limit: int = 1000) -> Sequence[UUID]:
        """Ids of sessions in order of creation (from the log, for tools and tests)."""
        notifications = self.recorder.select_notifications(
            start=None, limit=limit, topics=[Session.SessionStarted.TOPIC]
        )
        return [UUID(str(n.originator_id)) for n in notifications]


class _DataclassAsDict(Transcoding):
    """Stores a state dataclass (for snapshots) as a dict of its fields."""

    def __init__(self, cls: type[Any]) -> None:
        self.type = cls
        self.name = f"turnlog.{cls.__name__}.v1"
        self._fields = [f.name for f in dataclasses.fields(cls)]

    def encode(self, obj: Any) -> dict[str, Any]:
        return {name: _plain(getattr(obj, name)) for name in self._fields}

    def decode(self, data: dict[str, Any]) -> Any:
        obj = self.type(**data)
        # Member lookup by value without the enum call's overhead (hot when a
        # long session's snapshot is decoded).
        if isinstance(obj, Turn):
            obj.state = _TURN_STATES[obj.state]
        elif isinstance(obj, ToolCall):
            obj.state = _CALL_STATES[obj.state]
        return obj


_TURN_STATES: dict[str, TurnState] = {s.value: s for s in TurnState}
_CALL_STATES: dict[str, CallState] = {s.value: s for s in CallState}


def _plain(value: Any) -> Any:
    # StrEnum members become plain strings; decode() turns them back.
    return str(value) if isinstance(value, (TurnState, CallState)) else value
