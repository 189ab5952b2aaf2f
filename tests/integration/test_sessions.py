"""The Sessions application on a real PostgreSQL."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest
from psycopg import sql

from tests.conftest import raw_events
from turnlog.application.errors import ConcurrentModification, InvalidNamespace, SessionNotFound
from turnlog.application.news import News
from turnlog.application.runtime import Runtime
from turnlog.application.sessions import Sessions
from turnlog.application.settings import Settings
from turnlog.application.store.topics import CHANGE_MARK, WORK_MARK
from turnlog.domain import errors
from turnlog.domain.session import Session
from turnlog.interface.bootstrap import build_runtime


def new_session(rt: Runtime, **fields: object) -> Session:
    written = rt.sessions.create_session(tools=rt.executor.tools.names(), **fields)
    return rt.sessions.get_session(written.session_id)


def ask(rt: Runtime, session: Session, message: str) -> str:
    sent = rt.send(session.id, message)
    assert sent.turn.state == "completed", sent.turn
    return sent.turn.reply


def test_a_fresh_instance_continues_a_session_from_the_stored_events(settings: Settings) -> None:
    first = build_runtime(settings)
    session = new_session(first)
    assert ask(first, session, "The codeword is saffron") == "Noted. I will remember the codeword."
    first.close()

    second = build_runtime(settings)  # new pool, new objects, same namespace
    try:
        assert ask(second, session, "What is the codeword?") == "The codeword is saffron."
        assert [t.state for t in second.sessions.get_record(session.id).turns] == [
            "completed",
            "completed",
        ]
    finally:
        second.close()


def test_a_concurrent_save_is_detected_retried_once_then_surfaces_as_a_conflict(
    runtime: Runtime, settings: Settings, database: object
) -> None:
    session = new_session(runtime)
    # From a fresh load: a start from this process's copy of its own save is one
    # run more (tests/integration/test_written_copies.py).
    runtime.sessions.copies.forget(session.id)
    other = build_runtime(settings)
    calls = 0

    def decide_while_another_process_writes(s: Session) -> None:
        nonlocal calls
        calls += 1
        # Another process writes to the same stream between our load and our save.
        other.sessions.update(
            s.id, lambda o: o.trigger_event(o.Closed, reason=f"other {calls}", actor="x")
        )
        s.trigger_event(s.Closed, reason="ours", actor="test")

    try:
        with pytest.raises(ConcurrentModification):
            runtime.sessions.update(session.id, decide_while_another_process_writes)
    finally:
        other.close()
    assert calls == 2  # reloaded and decided again once
    rows = raw_events(database, settings.namespace, session.id)  # type: ignore[arg-type]
    versions = [r[2] for r in rows]
    assert versions == list(range(1, len(versions) + 1))
    topics = [r[3] for r in rows]
    # Both of the other writer's events are kept; ours were not written.
    assert topics.count("turnlog.session.SessionClosed.v1") == 2
    assert len(topics) == 3


def test_a_repeated_idempotency_key_returns_the_first_turn(
    runtime: Runtime, settings: Settings, database: object
) -> None:
    session = new_session(runtime)
    first = runtime.sessions.submit_turn(session.id, "hello", "key-1")
    again = runtime.sessions.submit_turn(session.id, "hello", "key-1")
    assert again.turn_id == first.turn_id
    assert again.created is False and again.position is None
    with pytest.raises(errors.IdempotencyKeyReused):
        runtime.sessions.submit_turn(session.id, "something else", "key-1")
    topics = [r[3] for r in raw_events(database, settings.namespace, session.id)]  # type: ignore[arg-type]
    assert topics.count("turnlog.session.TurnSubmitted.v1") == 1


def test_two_namespaces_never_see_each_others_sessions(
    settings: Settings, database: object
) -> None:
    other_settings = settings.model_copy(update={"namespace": f"t_{uuid4().hex[:12]}"})
    a = build_runtime(settings)
    b = build_runtime(other_settings)
    try:
        session = new_session(a, title="only in a")
        with pytest.raises(SessionNotFound):
            b.sessions.get_session(session.id)
        assert list(b.sessions.session_ids()) == []
        assert list(a.sessions.session_ids()) == [session.id]
    finally:
        a.close()
        b.close()
        from tests.conftest import drop_namespace

        drop_namespace(database, other_settings.namespace)  # type: ignore[arg-type]


def test_an_invalid_namespace_is_refused_before_any_sql_runs(database: object) -> None:
    from turnlog.application.store.database import create_schema

    with pytest.raises(ValueError, match="invalid namespace"):
        Settings(namespace="Robert'); DROP TABLE x;--")

    class Unusable:
        def execute(self, *args: object) -> None:
            raise AssertionError("SQL was sent for an invalid namespace")

    with pytest.raises(InvalidNamespace):
        create_schema(Unusable(), "1bad")  # type: ignore[arg-type]


def test_an_unknown_tool_in_a_model_reply_fails_the_turn_with_the_reason(runtime: Runtime) -> None:
    session = new_session(runtime)
    sent = runtime.send(session.id, '/tool no_such_tool {"x": 1}')
    assert sent.turn.state == "failed"
    assert "unknown tool 'no_such_tool'" in sent.turn.error
    # The failed turn does not block the next one.
    assert ask(runtime, session, "hello") == "Echo: hello"


def test_the_step_limit_fails_the_turn(settings: Settings) -> None:
    rt = build_runtime(settings.model_copy(update={"max_steps": 1}))
    try:
        session = new_session(rt)
        sent = rt.send(session.id, '/tool echo {"text": "hi"}')
        assert sent.turn.state == "failed"
        assert "step limit" in sent.turn.error
    finally:
        rt.close()


def test_a_tool_round_trip_records_every_step(
    runtime: Runtime, settings: Settings, database: object
) -> None:
    session = new_session(runtime)
    reply = ask(runtime, session, '/tool echo {"text": "ping"}')
    assert reply == 'Tool echo returned: {"text": "ping"}'
    topics = [r[3].split(".")[2] for r in raw_events(database, settings.namespace, session.id)]  # type: ignore[arg-type]
    assert topics == [
        "SessionStarted",
        "TurnSubmitted",
        "TurnClaimed",
        "ModelReplied",
        "ToolCallStarted",
        "ToolCallSucceeded",
        "ModelReplied",
        "TurnCompleted",
    ]


def test_refused_commands_write_nothing(
    runtime: Runtime, settings: Settings, database: object
) -> None:
    session = new_session(runtime)
    before = raw_events(database, settings.namespace)  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidMessage):
        runtime.sessions.submit_turn(session.id, "   ")
    with pytest.raises(errors.InvalidMessage):
        runtime.sessions.submit_turn(session.id, "x" * (64 * 1024 + 1))
    with pytest.raises(SessionNotFound):
        runtime.sessions.submit_turn(uuid4(), "hello")
    with pytest.raises(errors.TurnNotFound):
        runtime.sessions.abandon_turn(session.id, "nope", "reason", "actor")
    assert raw_events(database, settings.namespace) == before  # type: ignore[arg-type]


def test_snapshots_keep_loading_short_and_equal_to_a_full_replay(
    settings: Settings, database: object
) -> None:
    rt = build_runtime(settings.model_copy(update={"snapshot_interval": 5}))
    try:
        session = new_session(rt)
        for i in range(6):
            ask(rt, session, f"message {i}")
        with psycopg.connect(database.conninfo) as conn:  # type: ignore[attr-defined]
            count = conn.execute(
                sql.SQL("SELECT count(*) FROM {}.sessions_snapshots").format(
                    sql.Identifier(settings.schema_name)
                )
            ).fetchone()
        # Superseded snapshots are pruned: the latest two are kept.
        assert count is not None and count[0] == 2
        with_snapshots = rt.sessions.get_session(session.id)
        events_only = Sessions(
            env={**_env(rt), "IS_SNAPSHOTTING_ENABLED": "n"}, snapshot_interval=10_000
        )
        try:
            replayed = events_only.repository.get(session.id)
        finally:
            events_only.close()
        assert replayed.turns == with_snapshots.turns
        assert replayed.finished == with_snapshots.finished
        assert replayed.__dict__ == with_snapshots.__dict__
        assert replayed.version == with_snapshots.version
    finally:
        rt.close()


def _env(rt: Runtime) -> dict[str, str]:
    from turnlog.application.store.database import library_env

    return library_env(rt.db, rt.settings, create_table=False)


@pytest.mark.parametrize(
    "message",
    ['/tool echo {"text": "ping"}', "hello", '/tool no_such_tool {"x": 1}'],
    ids=["tool call", "plain reply", "failed"],
)
def test_the_turn_a_run_returns_equals_its_stored_record(runtime: Runtime, message: str) -> None:
    # The run hands back the turn object its last step finished in memory, not a read of
    # the record: the two must not differ in anything.
    session = new_session(runtime)
    for _ in range(3):
        submitted = runtime.sessions.submit_turn(session.id, message)
        ran = runtime.executor.run_turn(session.id, submitted.turn_id)
        assert not ran.state.is_open
        assert ran == runtime.sessions.turn_record(session.id, submitted.turn_id)[1]


def test_each_committed_save_is_told_to_the_news_and_a_failing_listener_fails_nothing(
    runtime: Runtime,
) -> None:
    told: list[tuple[UUID, str, int]] = []

    def broken(news: Sequence[News]) -> None:
        raise RuntimeError("a listener's own bug")

    def listener(news: Sequence[News]) -> None:
        told.extend((n.session_id, n.mark, n.version) for n in news)

    feed = runtime.sessions.news
    feed.subscribe(broken, CHANGE_MARK)
    feed.subscribe(listener, CHANGE_MARK + WORK_MARK)
    try:
        written = runtime.sessions.create_session(title="told")
        submitted = runtime.sessions.submit_turn(written.session_id, "hello")
    finally:
        feed.unsubscribe(broken)
        feed.unsubscribe(listener)
    runtime.sessions.submit_turn(written.session_id, "later", enqueue=True)  # after: not told

    sid = written.session_id
    assert submitted.created
    assert told == [(sid, CHANGE_MARK, 1), (sid, WORK_MARK, 2), (sid, CHANGE_MARK, 2)]
    assert len(runtime.sessions.get_session(written.session_id).turns) == 2


def _range_reads(sessions: Sessions) -> tuple[list[tuple[int, int]], Any]:
    """Record each range read of ``sessions``'s events; returns the list and the undo."""
    reads: list[tuple[int, int]] = []
    get = sessions.events.get

    def counted(originator_id: Any, gt: int | None = None, lte: int | None = None) -> Any:
        if lte is not None:  # a range (a fast-forward of the cached session has none)
            reads.append((gt or 0, lte))
        return get(originator_id, gt=gt, lte=lte)

    sessions.events.get = counted  # type: ignore[method-assign]
    return reads, lambda: delattr(sessions.events, "get")


def test_a_turn_another_process_ran_is_rebuilt_from_what_this_one_read_of_it(
    runtime: Runtime, settings: Settings
) -> None:
    sid = runtime.sessions.create_session(title="read here", tools=["echo"]).session_id
    runtime.send(sid, "The codeword is saffron")
    here = build_runtime(settings)  # an API process: it keeps the session it answers for
    try:
        here.sessions.get_session(sid)
        turn_id = runtime.send(sid, '/tool echo {"text": "hi"}').turn.turn_id  # elsewhere
        reads, undo = _range_reads(here.sessions)
        try:
            # Its load of the session reads the turn's events (a fast-forward of the
            # cached object); the turn is rebuilt from those, not read again.
            _, rebuilt = here.sessions.turn_record(sid, turn_id)
        finally:
            undo()
        assert reads == []
    finally:
        here.close()
    stored = build_runtime(settings)  # a process that knew nothing: reads the range
    try:
        reads, undo = _range_reads(stored.sessions)
        try:
            _, from_store = stored.sessions.turn_record(sid, turn_id)
        finally:
            undo()
        assert len(reads) == 1
    finally:
        stored.close()
    assert rebuilt.state == from_store.state == "completed"
    assert rebuilt == from_store


def test_a_turn_this_process_just_ran_is_rebuilt_from_what_it_saved_exactly_as_from_the_store(
    runtime: Runtime, settings: Settings
) -> None:
    sid = runtime.sessions.create_session(title="in memory", tools=["echo"]).session_id
    runtime.send(sid, "The codeword is saffron")  # the next turn's request keeps what follows
    turn_id = runtime.send(sid, '/tool echo {"text": "hi"}').turn.turn_id
    reads: list[tuple[int, int]] = []
    get = runtime.sessions.events.get

    def counted(originator_id: Any, gt: int | None = None, lte: int | None = None) -> Any:
        if lte is not None:  # a range (a fast-forward of the cached session has none)
            reads.append((gt or 0, lte))
        return get(originator_id, gt=gt, lte=lte)

    runtime.sessions.events.get = counted  # type: ignore[method-assign]
    try:
        _, here = runtime.sessions.turn_record(sid, turn_id)
    finally:
        del runtime.sessions.events.get
    assert reads == []  # the turn's range came from memory

    other = build_runtime(settings)  # another process: reads the range from the store
    try:
        _, stored = other.sessions.turn_record(sid, turn_id)
    finally:
        other.close()
    assert here.state == stored.state == "completed"
    assert here == stored
