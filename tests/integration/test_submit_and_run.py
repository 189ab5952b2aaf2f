"""A turn submitted and run by the same caller: the claim goes in the submission's save."""

from __future__ import annotations

from uuid import uuid4

import pytest

from tests.conftest import raw_events
from turnlog.application.errors import LeaseLost, SessionNotFound
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database
from turnlog.domain import errors


def topics(database: Database, settings: Settings, session_id: object) -> list[str]:
    return [r[3].split(".")[2] for r in raw_events(database, settings.namespace, session_id)]


class Lost:
    """A lease found lost at its first check."""

    def check(self) -> None:
        raise LeaseLost("lost before anything was written")

    def guard(self, still_ours: object) -> None:
        raise AssertionError("never reached")


def test_a_turn_is_claimed_in_its_submission_and_run(runtime: Runtime) -> None:
    sid = runtime.sessions.create_session(title="here").session_id
    submitted, turn = runtime.executor.submit_and_run(sid, "hello", "key-1")
    assert turn is not None and turn.state == "completed" and turn.claim == 1
    assert turn.turn_id == submitted.turn_id and submitted.created
    assert turn.steps[-1].text == "Echo: hello"


def test_a_repeated_key_runs_nothing_and_saves_nothing(
    runtime: Runtime, database: Database, settings: Settings
) -> None:
    sid = runtime.sessions.create_session(title="again").session_id
    first, _ = runtime.executor.submit_and_run(sid, "hello", "key-1")
    before = topics(database, settings, sid)
    again, turn = runtime.executor.submit_and_run(sid, "hello", "key-1")
    assert turn is None  # the key's turn, already run: nothing claimed
    assert (again.turn_id, again.created, again.position) == (first.turn_id, False, None)
    assert topics(database, settings, sid) == before


def test_a_follow_up_behind_an_open_turn_is_queued_not_claimed(
    runtime: Runtime, database: Database, settings: Settings
) -> None:
    sid = runtime.sessions.create_session(title="queue").session_id
    ahead = runtime.sessions.submit_turn(sid, "first")
    submitted, turn = runtime.executor.submit_and_run(sid, "second", enqueue=True)
    assert turn is None and submitted.created
    assert topics(database, settings, sid)[-2:] == ["TurnSubmitted", "TurnSubmitted"]
    queued = runtime.sessions.get_session(sid)
    assert [t.turn_id for t in queued.queued_turns()] == [submitted.turn_id]
    assert queued.open_turn is not None and queued.open_turn.turn_id == ahead.turn_id
    # Driven as after any submission: both run, in order.
    verdicts = runtime.continue_session(sid)
    assert [v.decision for v in verdicts] == ["start", "start"]


def test_a_refused_submission_writes_nothing(
    runtime: Runtime, database: Database, settings: Settings
) -> None:
    sid = runtime.sessions.create_session(title="refused").session_id
    runtime.sessions.submit_turn(sid, "first")
    before = topics(database, settings, sid)
    with pytest.raises(errors.TurnInProgress):
        runtime.executor.submit_and_run(sid, "second")
    with pytest.raises(LeaseLost):
        runtime.executor.submit_and_run(sid, "third", enqueue=True, lease=Lost())
    assert topics(database, settings, sid) == before


def test_a_message_to_an_unknown_session_is_refused_and_leaves_no_lease(runtime: Runtime) -> None:
    unknown = uuid4()
    with pytest.raises(SessionNotFound):
        runtime.send(unknown, "hello")
    lease = runtime.leases.try_acquire(unknown)  # given back on the way out
    assert lease is not None
    lease.release()
