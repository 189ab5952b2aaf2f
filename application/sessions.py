"""The Sessions application: commands over Session aggregates in PostgreSQL.

Every command loads the session, lets the aggregate decide, saves once and
returns ids and the log position of its last event. A save that loses an
optimistic-concurrency race (``IntegrityError``) is retried once on a fresh
load; a second loss surfaces as ``ConcurrentModification``. An unanswered commit
is settled by reading the stream again (``store.lost_commits``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar, cast
from uuid import UUID

from eventsourcing.application import (
    AggregateNotFoundError,
    Application,
    ProcessingEvent,
    project_aggregate,
)
from eventsourcing.persistence import IntegrityError, JSONTranscoder, Recording

from turnlog.application import saving, snapshotting
from turnlog.application.collector import collector_paused
from turnlog.application.errors import ConcurrentModification, InvalidVersion, SessionNotFound
from turnlog.application.news import NewsFeed
from turnlog.application.said import said_before
from turnlog.application.session_cache import SessionCache
from turnlog.application.store import epoch as store_epoch
from turnlog.application.store import purges, said_turns, session_log, version_ranges
from turnlog.application.store.transcodings import DataclassAsDict
from turnlog.application.written_copies import NEWS_MARKS, WrittenCopies
from turnlog.domain.compaction import ContextPolicy, summarizing_request, turns_to_cover
from turnlog.domain.durability import may_ride
from turnlog.domain.errors import DomainError
from turnlog.domain.request import ModelRequest, next_request
from turnlog.domain.session import (
    Session,
    check_deadline,
    deadline_after,
    replay_turns,
    retaining,
    summarised_dropped,
)
from turnlog.domain.turns import (
    IDEMPOTENCY_WINDOW,
    FinishedTurn,
    Step,
    ToolCall,
    Turn,
    version_span,
)

log = logging.getLogger("turnlog.sessions")

T = TypeVar("T")
# Re-decisions allowed to a command that races a running turn's writes (a
# follow-up, a cancel, an approval): each is one reload and one short save.
CONTENDED_ATTEMPTS = 8


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
    # The deadline of a turn whose submitter and session name none (TURNLOG_TURN_DEADLINE_SECONDS).
    default_deadline_seconds: float | None = None

    def __init__(
        self,
        env: dict[str, str] | None = None,
        snapshot_interval: int = 100,
        snapshot_keep: int = 2,
        riding: bool = True,
        idempotency_window: int = IDEMPOTENCY_WINDOW,
    ) -> None:
        # Per instance: the interval is a setting, not a class constant.
        self.snapshotting_intervals = {Session: snapshot_interval}  # type: ignore[misc]
        self.snapshot_keep = max(1, snapshot_keep)
        self.riding = riding  # saves that may be lost may ride on the next flush
        # Keyed submissions a session remembers (recorded in each TurnSubmitted).
        self.idempotency_window = max(1, idempotency_window)
        self.cache = SessionCache()
        # The process's one news feed: told of each save of this process once it
        # has committed, and of other processes' news by the follower (attach).
        self.news = NewsFeed()
        self.copies = WrittenCopies()  # where a command starts when this process wrote last
        self.news.subscribe(self.copies.told, NEWS_MARKS)
        super().__init__(env={"IS_SNAPSHOTTING_ENABLED": "y", **(env or {})})
        self.epoch = store_epoch.watch(self)
        said_turns.create_table(self)  # beside the library's tables, when it creates them

    def save(self, *objs: Any, **kwargs: Any) -> list[Recording[UUID]]:
        """``Application.save``, the objects' kinds told by their class (``saving``)."""
        return cast(list[Recording[UUID]], saving.save(self, objs, kwargs))

    def _take_snapshots(self, processing_event: ProcessingEvent[UUID]) -> None:
        snapshotting.take(self, processing_event)

    def prune_snapshots(self, session_id: UUID) -> int:
        """Delete a session's snapshots but the latest ``snapshot_keep``; returns how many."""
        return snapshotting.prune(self, session_id)

    def register_transcodings(self, transcoder: JSONTranscoder) -> None:
        super().register_transcodings(transcoder)
        for cls in (Turn, ToolCall, Step):
            transcoder.register(DataclassAsDict(cls))

    # ------------------------------------------------------------------ reads

    def get_session(self, session_id: UUID) -> Session:
        def project(aggregate: Any, events: Iterable[Any]) -> Any:
            if aggregate is None:  # rebuilt from the store (a snapshot, then events)
                return project_aggregate(aggregate, events)
            read = list(events)  # a fast-forward of the cached object: keep what it read
            if read:
                self.cache.keep(session_id, read)
            # As project_aggregate does, without its check of each event against a
            # typing Protocol (costly): these are this application's own events.
            for event in read:
                aggregate = event.mutate(aggregate)
            return aggregate

        epoch = self.epoch.current() if self.epoch else None  # before: a restart meanwhile tells
        try:
            # A cold load decodes a snapshot holding every finished turn's entry: many
            # small objects that all live on, which the collector need not scan meanwhile.
            with collector_paused():
                session: Any = self.repository.get(session_id, projector_func=project)
        except AggregateNotFoundError:
            raise self.missing(session_id) from None
        if not isinstance(session, Session):
            raise self.missing(session_id)
        if self.epoch:
            self.epoch.stamp(session, epoch)
        self.complete_ranges(session)
        return session

    def complete_ranges(self, session: Session) -> None:
        """Give turns upcast from a version-1 snapshot their version ranges (no-op otherwise)."""
        version_ranges.complete(self, session)

    def missing(self, session_id: UUID) -> Exception:
        """The error for a session with no events: purged (410), else not found (404)."""
        return purges.missing(self.recorder, session_id)

    def get_record(self, session_id: UUID) -> Session:
        """The session with every turn in full, replayed from all its events (for reads).

        Costs a read of the whole stream; the write path never uses it.
        """
        aggregate: Any = None
        for event in self.events.get(session_id):
            aggregate = cast(Any, event).mutate(aggregate)
            if isinstance(aggregate, Session) and not aggregate.retains_finished:
                retaining(aggregate)
                if isinstance(event, Session.Forked):
                    event.inherit(aggregate)  # the turns a fork carries, in full
        if not isinstance(aggregate, Session):
            raise self.missing(session_id)
        return aggregate

    def replay_range(self, session_id: UUID, first: int, last: int) -> Session:
        """The turns whose events lie in versions ``first..last``, rebuilt in full.

        From the latest events of the session this process saved or read, when
        they hold the whole range (a turn this process just ran, or whose
        events its last load of the session read); else read from the store.
        """
        if first > last:
            return replay_turns(session_id, ())
        kept = self.cache.between(session_id, first - 1, last)
        if kept is not None:
            return replay_turns(session_id, kept)
        return replay_turns(session_id, self.events.get(session_id, gt=first - 1, lte=last))

    def turn_record(self, session_id: UUID, turn_id: str) -> tuple[Session, Turn]:
        """One turn in full and the session object its calls are in.

        An open turn comes from the session itself; a finished one is rebuilt
        from its own events (its version range), whatever the session's length.
        """
        session = self.get_session(session_id)
        for turn in session.turns:
            if turn.turn_id == turn_id:
                return session, turn
        finished = session.finished_turn(turn_id)
        if finished is None:
            session.turn(turn_id)  # raises TurnNotFound
            raise AssertionError("unreachable")
        record = self.replay_range(session_id, finished.first_version, finished.last_version)
        return record, record.turn(turn_id)

    def turn_page(
        self, session_id: UUID, before: int | None, limit: int
    ) -> tuple[Session, list[tuple[Session, Turn]], int | None]:
        """Up to ``limit`` turns numbered below ``before`` (1: the first turn), newest first.

        Each turn comes with the session object its calls are in; the third
        value is the number to continue below (None: this page reaches the
        first turn). Finished turns are rebuilt from one range read of their
        own events, so a page costs the same however long the session is.
        """
        session = self.get_session(session_id)
        top = session.turn_count if before is None else min(before - 1, session.turn_count)
        low = max(top - limit, 0)
        numbers = range(top, low, -1)
        done = len(session.finished)
        by_id: dict[str, Turn] = {}
        record = session
        if low < done:
            first, last = version_span(session.finished[low : min(top, done)])
            record = self.replay_range(session_id, first, last)
            by_id = {t.turn_id: t for t in record.turns}
        page: list[tuple[Session, Turn]] = []
        open_turns = [t for t in session.turns if t.state.is_open]
        for number in numbers:
            if number > done:
                if number - done <= len(open_turns):
                    page.append((session, open_turns[number - done - 1]))
            elif session.finished[number - 1].turn_id in by_id:  # else summarised before a fork
                page.append((record, by_id[session.finished[number - 1].turn_id]))
        return session, page, (low + 1 if low > 0 else None)

    def request_for(self, session: Session) -> ModelRequest:
        """The next model request: the session's open turn plus the earlier turns it carries.

        The earlier turns come as the messages they said, rendered once from
        their own events and kept (``application.said``); never from a read
        model, which may lag.
        """
        return next_request(session, said=said_before(self, session))

    def request_at(self, session_id: UUID, version: int) -> ModelRequest:
        """The request ``request_for`` builds from the session as it was at ``version``.

        The aggregate is rebuilt at that version from the stream (snapshots
        at or below it may serve), and the earlier turns it carries are read
        by version range, all at or below it: what the runtime would have
        sent to the provider then (for incident review). Never cached.
        """
        return next_request(*self.at_version(session_id, version))

    def at_version(self, session_id: UUID, version: int) -> tuple[Session, Session]:
        """The session rebuilt at ``version``, and the finished turns its next request carries.

        A version the session never had is ``InvalidVersion`` (422).
        """
        latest = self.version_of(session_id)
        if latest == 0:
            raise self.missing(session_id)
        if not 1 <= version <= latest:
            raise InvalidVersion(
                f"version {version} is not one of session {session_id}'s (1..{latest})"
            )
        session: Any = self.repository.get(session_id, version=version)
        if not isinstance(session, Session):
            raise SessionNotFound(f"session {session_id} not found")
        self.complete_ranges(session)
        first, last = self.window(session)
        return session, summarised_dropped(session, self.replay_range(session_id, first, last))

    def _earlier(self, session: Session, first: int, last: int) -> Session:
        """The finished turns in versions ``first..last``, rebuilt, kept per process.

        A finished turn never changes, so the turns rebuilt for one request
        serve the next: only the events after the last one read are fetched
        (the window moves forward, never back, unless it starts elsewhere).
        """
        session_id = session.id
        hit = self.cache.take_earlier(session_id)
        if hit is not None and hit[0] == first and hit[1] <= last:
            earlier = hit[2]
            known = self.cache.between(session_id, hit[1], last)
            new: Iterable[Any] = known or ()
            if known is None:  # not all known here: read them
                new = self.events.get(session_id, gt=hit[1], lte=last) if hit[1] < last else ()
            for event in new:
                if not isinstance(event, Session.Started):
                    cast(Any, event).apply(earlier)
        else:
            earlier = self.replay_range(session_id, first, last)
        self.cache.put_earlier(session_id, first, last, earlier)
        return summarised_dropped(session, earlier)

    def _tell_saved(self, session: Session, events: Sequence[Any]) -> None:
        """After every commit of this process's writes: keep them, then tell the news."""
        session_id = session.id
        if events:
            self.cache.keep(session_id, list(events))
            self.copies.saved(session, events, self.epoch.stamp_of(session) if self.epoch else None)
        # The save has committed: a listener's failure must not make it look failed
        # (the feed catches what its listeners raise).
        self.news.saved(session_id, events)

    def _copy(self, session_id: UUID) -> Session | None:
        """This process's copy of its last save of the session, stamped with that save's epoch."""
        taken = self.copies.take(session_id)
        if taken is None:
            return None
        if self.epoch:
            self.epoch.stamp(taken[0], taken[1])
        return taken[0]

    def window(self, session: Session) -> tuple[int, int]:
        """The version range of the finished turns the next request carries.

        Every finished turn after the latest context summary (all of them
        without one): an index into the summary of finished turns, so its
        cost does not depend on the session's length.
        """
        covered = session.compacted_turns
        if len(session.finished) <= covered:
            return 1, 0
        return version_span(session.finished[covered:])

    def compaction_for(self, session: Session) -> tuple[ModelRequest, int] | None:
        """The summarising request the next request needs first, and the turns it covers.

        None when the session's context policy (if any) holds without one.
        """
        if ContextPolicy.of(session) is None:
            return None
        first, last = self.window(session)
        earlier = self._earlier(session, first, last)
        cover = turns_to_cover(session, earlier)
        if not cover:
            return None
        return summarizing_request(session, earlier, cover), session.compacted_turns + cover

    def version_of(self, session_id: UUID) -> int:
        """The session's latest stored version: one index lookup, no events read.

        A worker running a tool asks it about twice a second to notice a cancel
        request without loading the session each time.
        """
        if not session_log.on_postgres(self.recorder):
            return self.get_session(session_id).version  # in-memory persistence (unit tests)
        return session_log.latest_version(self.recorder, session_id)

    # --------------------------------------------------------------- commands

    def create_session(self, **fields: Any) -> Written:
        """Start a new session; ``fields`` are those of ``Session.start``."""
        return self.save_new(Session.start(**fields))

    def save_new(self, session: Session) -> Written:
        """Save a session just begun (its first events), a lost commit settled."""
        pending = list(session.pending_events)
        position = store_epoch.save(self, session, False)
        self._tell_saved(session, pending)
        return Written(session.id, session.version, position)

    def submit_turn(
        self,
        session_id: UUID,
        message: str,
        idempotency_key: str = "",
        *,
        enqueue: bool = False,
        deadline_seconds: float | None = None,
        traceparent: str = "",
        then: Callable[[Session, Turn | FinishedTurn, bool], None] | None = None,
    ) -> Submitted:
        """Queue a user message as a new turn (or return the turn its key created).

        ``enqueue``: queue it behind a queued or running turn instead of refusing.
        ``deadline_seconds``: when the runtime cancels it; None takes the
        session's default, then ``default_deadline_seconds`` (None: no deadline).
        The absolute deadline is computed here and stored in the event.
        ``then``: more to record in the same save, given the session, the turn
        and whether it was created (a claim: ``Executor.submit_and_run``).
        """
        if deadline_seconds is not None:
            check_deadline(deadline_seconds)

        def submit(s: Session) -> tuple[Turn | FinishedTurn, bool]:
            seconds = deadline_seconds or s.deadline_seconds or self.default_deadline_seconds
            deadline_at = deadline_after(datetime.now(UTC), seconds)
            turn, created = s.submit_turn(
                message,
                idempotency_key,
                enqueue=enqueue,
                deadline_at=deadline_at,
                traceparent=traceparent,
                idempotency_window=self.idempotency_window,
            )
            if then is not None:
                then(s, turn, created)
            return turn, created

        # A follow-up is submitted while a worker writes the turn ahead of it:
        # losing a race to those writes is expected, so it re-decides a few times.
        tries = CONTENDED_ATTEMPTS if enqueue else 2
        (turn, created), written = self.update(session_id, submit, attempts=tries)
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

    closed = False  # set by close(): the process is stopping and its pool is gone

    def close(self) -> None:
        self.closed = True
        super().close()

    def close_session(self, session_id: UUID, reason: str, actor: str) -> Written:
        """Close a session; it takes no more turns."""
        return self.update(session_id, lambda s: s.close(reason, actor))[1]

    def update(
        self,
        session_id: UUID,
        decide: Callable[[Session], T],
        current: Session | None = None,
        attempts: int = 2,
    ) -> tuple[T, Written]:
        """Run ``decide`` on the session and save what it recorded; returns what it returned.

        On a version conflict the session is reloaded and ``decide`` runs
        again on fresh state (``attempts`` runs in all). ``current`` is a
        session object already at the latest version this process knows (the
        agent loop keeps one between steps): it saves a reload. After a
        conflict it is discarded, since its state already holds the events
        that failed to save. A caller that goes on with the session object
        has ``decide`` return it: the object ``decide`` last ran on is the one
        saved, now current. Without ``current``, a command starts from this
        process's copy of its own last save of the session when it has one
        (``written_copies``): a lost race, a refusal or nothing to record
        from that copy decides again on a fresh load (one more run).
        """
        copied = current is None and (current := self._copy(session_id)) is not None
        attempts += copied
        for attempt in range(1, attempts + 1):
            session = current if current is not None else self.get_session(session_id)
            current = None
            try:
                result = decide(session)
            except DomainError:
                if copied and attempt == 1:
                    continue
                raise
            if not session.pending_events:
                if copied and attempt == 1:
                    continue
                return result, Written(session.id, session.version, None)
            pending = list(session.pending_events)
            rides = self.riding and may_ride(session.calls, pending)
            try:
                position = store_epoch.save(self, session, rides)
            except IntegrityError:
                if attempt == attempts:
                    raise ConcurrentModification(
                        f"session {session_id} was changed concurrently; try again"
                    ) from None
                continue
            self._tell_saved(session, pending)
            return result, Written(session.id, session.version, position)
        raise AssertionError("unreachable")

    def session_ids(self, limit: int = 1000) -> Sequence[UUID]:
        """Ids of sessions in order of creation (from the log, for tools and tests)."""
        notifications = self.recorder.select_notifications(
            start=None, limit=limit, topics=[Session.Started.TOPIC, Session.Forked.TOPIC]
        )
        return [UUID(str(n.originator_id)) for n in notifications]
