"""Commands start from the process's copy of its own last save: no read, and never a wrong answer.

A turn run in the process that submitted it reads nothing of the session's
stream back; a copy made stale by another process's write costs a lost race
or a second decision on a fresh load, never a refusal, a stale answer or a
lost event; news of another process's write drops the copy.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest

from tests.conftest import raw_events
from tests.deadlines import poll
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.application.store.follower import LogFollower
from turnlog.application.store.recorder import Hint
from turnlog.application.store.topics import WORK_MARK
from turnlog.interface.bootstrap import build_runtime

TOOL_TURN = '/tool echo {"text": "hi"}'


@pytest.fixture
def other(settings: Settings) -> Iterator[Runtime]:
    """A second runtime on the same namespace: another process, as far as the first knows."""
    rt = build_runtime(settings)
    yield rt
    rt.close()


def run_turn(rt: Runtime, session_id: UUID, message: str = TOOL_TURN) -> None:
    submitted = rt.sessions.submit_turn(session_id, message)
    turn = rt.executor.run_turn(session_id, submitted.turn_id)
    assert turn.state == "completed", turn


def counting_stream_reads(rt: Runtime) -> list[Any]:
    """Every read of a session's stream by ``rt`` from now on (the store is still read)."""
    reads: list[Any] = []
    recorder: Any = rt.sessions.recorder
    select_events = recorder.select_events

    def counted(*args: Any, **kwargs: Any) -> Any:
        reads.append(args[0] if args else kwargs.get("originator_id"))
        return select_events(*args, **kwargs)

    recorder.select_events = counted
    return reads


def test_turns_run_by_the_process_that_submits_them_read_no_stream_back(
    runtime: Runtime,
) -> None:
    session_id = runtime.sessions.create_session(tools=["echo"]).session_id
    run_turn(runtime, session_id)
    reads = counting_stream_reads(runtime)
    for _ in range(3):  # submit, claim, model, tool, model: each starts from memory
        run_turn(runtime, session_id)
    assert reads == []
    assert runtime.sessions.copies.taken >= 6  # each submission and each claim
    record = runtime.sessions.get_record(session_id)  # the stored stream agrees
    assert [t.state for t in record.turns] == ["completed"] * 4


def test_a_refusal_from_a_stale_copy_is_decided_again_on_the_stored_state(
    runtime: Runtime, other: Runtime, settings: Settings, database: Any
) -> None:
    session_id = runtime.sessions.create_session(tools=["echo"]).session_id
    queued = runtime.sessions.submit_turn(session_id, "first")
    # Another process runs the queued turn to its end: this one's copy still has it queued.
    assert other.executor.run_turn(session_id, queued.turn_id).state == "completed"
    assert runtime.sessions.copies.take(session_id) is not None

    second = runtime.sessions.submit_turn(session_id, "second")  # no TurnInProgress

    assert second.created
    assert second.version == runtime.sessions.version_of(session_id)
    versions = [r[2] for r in raw_events(database, settings.namespace, session_id)]
    assert versions == list(range(1, len(versions) + 1))


def test_a_stale_copy_that_records_nothing_answers_from_the_stored_state(
    runtime: Runtime, other: Runtime
) -> None:
    session_id = runtime.sessions.create_session(tools=["echo"]).session_id
    first = runtime.sessions.submit_turn(session_id, "hello", idempotency_key="k1")
    assert other.executor.run_turn(session_id, first.turn_id).state == "completed"

    again = runtime.sessions.submit_turn(session_id, "hello", idempotency_key="k1")

    assert (again.turn_id, again.created) == (first.turn_id, False)
    # The version of the store, not the one this process last wrote.
    assert again.version == runtime.sessions.version_of(session_id) > first.version


def test_a_write_from_a_stale_copy_loses_the_race_and_is_written_once_fresh(
    runtime: Runtime, other: Runtime, settings: Settings, database: Any
) -> None:
    session_id = runtime.sessions.create_session(tools=["echo"]).session_id
    run_turn(runtime, session_id)
    run_turn(other, session_id)  # this process's copy is now behind by a whole turn

    closed = runtime.sessions.close_session(session_id, "done", "test")

    rows = raw_events(database, settings.namespace, session_id)
    assert [r[2] for r in rows] == list(range(1, len(rows) + 1))
    assert closed.version == len(rows)
    topics = [r[3] for r in rows]
    assert topics.count("turnlog.session.TurnCompleted.v1") == 2
    assert topics[-1] == "turnlog.session.SessionClosed.v1"


def test_news_of_another_process_write_drops_the_copy_and_own_news_keeps_it(
    runtime: Runtime, other: Runtime
) -> None:
    sessions = runtime.sessions
    session_id = sessions.create_session(tools=["echo"]).session_id
    run_turn(runtime, session_id)
    version = sessions.version_of(session_id)
    sessions.news.hints([Hint(session_id, WORK_MARK, version)])  # its own save, told again
    assert sessions.copies.take(session_id) is not None

    follower = LogFollower(sessions, runtime.db)
    sessions.news.attach(follower)
    follower.start()
    try:
        run_turn(other, session_id)
        poll(lambda: sessions.copies.take(session_id) is None, 20, "the copy to be dropped")
    finally:
        follower.stop()
        sessions.news.detach()
    reads = counting_stream_reads(runtime)
    taken = sessions.copies.taken
    submitted = sessions.submit_turn(session_id, TOOL_TURN)
    assert (len(reads), sessions.copies.taken) == (1, taken)  # from a fresh load
    assert runtime.executor.run_turn(session_id, submitted.turn_id).state == "completed"
    assert sessions.copies.taken == taken + 1  # the claim: from memory again
