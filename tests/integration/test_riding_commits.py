"""Saves that ride on the next flush, and what the insert refuses after a crash could lose them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from eventsourcing.persistence import IntegrityError, StoredEvent

from tests.deadlines import poll
from tests.integration.test_chain import links, query
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.application.store import chain, lost_commits
from turnlog.application.store.epoch import ServerRestarted
from turnlog.application.store.lost_commits import RIDES
from turnlog.interface.bootstrap import build_runtime
from turnlog.projections import ReadModels, read_models
from turnlog.projections.view import Fold, fold_together

LONG_AGO = datetime(2000, 1, 1, tzinfo=UTC)  # no server started then


def saves_of_a_turn(
    runtime: Runtime, message: str, sent: bool = False
) -> list[tuple[list[str], bool]]:
    """Each save of one turn through the application: its topics' names, and whether it rode.

    ``sent``: through ``Runtime.send`` (submitted and run here); otherwise
    submitted, then run as a worker runs what someone else submitted.
    """
    recorder: Any = runtime.sessions.recorder
    real = recorder.insert_events
    seen: list[tuple[list[str], bool]] = []

    def watched(stored: Any, **kwargs: Any) -> Any:
        seen.append(([e.topic.split(".")[2] for e in stored], bool(kwargs.get(RIDES))))
        return real(stored, **kwargs)

    recorder.insert_events = watched
    try:
        sid = runtime.sessions.create_session(tools=["echo", "append_file"]).session_id
        seen.clear()
        if sent:
            turn = runtime.send(sid, message).turn
        else:
            submitted = runtime.sessions.submit_turn(sid, message)
            turn = runtime.executor.run_turn(sid, submitted.turn_id)
        assert turn.state == "completed", turn
    finally:
        del recorder.insert_events
    return seen


def test_a_turn_with_a_read_only_call_saves_four_times_and_lets_the_claim_ride(
    runtime: Runtime,
) -> None:
    saves = saves_of_a_turn(runtime, '/tool echo {"text": "hi"}')
    assert saves == [
        (["TurnSubmitted"], False),
        (["TurnClaimed"], True),
        # The reply asking for the tool and the call's intent: one durable save.
        (["ModelReplied", "ToolCallStarted"], False),
        # The read-only outcome is held and goes with the turn's next save.
        (["ToolCallSucceeded", "ModelReplied", "TurnCompleted"], False),
    ]


def test_a_turn_sent_here_saves_its_claim_with_the_submission(runtime: Runtime) -> None:
    saves = saves_of_a_turn(runtime, '/tool echo {"text": "hi"}', sent=True)
    assert saves == [
        (["TurnSubmitted", "TurnClaimed"], False),  # durable, as a submission is
        (["ModelReplied", "ToolCallStarted"], False),
        (["ToolCallSucceeded", "ModelReplied", "TurnCompleted"], False),
    ]


def test_a_side_effecting_outcome_is_saved_alone_and_waits_for_the_disk(
    runtime: Runtime,
) -> None:
    saves = saves_of_a_turn(runtime, '/tool append_file {"path": "a.txt", "text": "x"}')
    assert saves == [
        (["TurnSubmitted"], False),
        (["TurnClaimed"], True),
        (["ModelReplied", "ToolCallStarted"], False),
        (["ToolCallSucceeded"], False),
        (["ModelReplied", "TurnCompleted"], False),
    ]


def test_a_save_that_rode_is_chained_like_any_other(runtime: Runtime, settings: Settings) -> None:
    saves_of_a_turn(runtime, '/tool echo {"text": "hi"}')
    for sid in runtime.sessions.session_ids():
        found = chain.check(links(settings, sid))
        assert not found.broken and not found.unchained and found.chained > 0


def rows(settings: Settings, session_id: Any) -> int:
    found = query(
        settings, "SELECT count(*) AS n FROM sessions_events WHERE originator_id = %s", session_id
    )
    return int(found[0]["n"])


def test_a_save_over_a_missing_version_stores_nothing(runtime: Runtime, settings: Settings) -> None:
    sid = runtime.sessions.create_session(title="gap").session_id
    version = runtime.sessions.get_session(sid).version
    before = rows(settings, sid)
    recorder: Any = runtime.sessions.recorder
    later = [
        StoredEvent(sid, version + 2, "turnlog.test#1", b"{}"),
        StoredEvent(sid, version + 3, "turnlog.test#1", b"{}"),
    ]
    with pytest.raises(IntegrityError, match=f"version {version + 1} is missing"):
        recorder.insert_events(later)
    # Another stream in the same save is refused with it: all or nothing.
    other = runtime.sessions.create_session(title="whole").session_id
    both = [StoredEvent(other, 2, "turnlog.test#1", b"{}"), later[0]]
    with pytest.raises(IntegrityError):
        recorder.insert_events(both)
    assert rows(settings, sid) == before
    assert rows(settings, other) == 1


def test_a_session_read_before_the_server_restarted_is_read_again(
    runtime: Runtime, settings: Settings
) -> None:
    sessions = runtime.sessions
    sid = sessions.create_session(title="epoch").session_id
    session = sessions.get_session(sid)
    assert sessions.epoch is not None
    assert sessions.epoch.stamp_of(session) is not None  # read in the server's epoch
    session.close("by the test", "test")
    before = rows(settings, sid)
    with pytest.raises(IntegrityError, match="restarted"):
        lost_commits.save(sessions, session, False, LONG_AGO)
    assert rows(settings, sid) == before
    # Through update, the stamp is the one it was read with, so the save goes in.
    sessions.close_session(sid, "closed", "test")
    assert rows(settings, sid) == before + 1


def test_learning_of_a_restart_drops_what_the_process_kept(runtime: Runtime) -> None:
    sessions = runtime.sessions
    sid = sessions.create_session(title="kept").session_id
    sessions.get_session(sid)
    assert sessions.cache.between(sid, 0, 1) is not None
    assert sessions.copies.take(sid) is not None
    cache = sessions.repository.cache
    assert sessions.epoch is not None
    now = sessions.epoch.current()
    assert now is not None
    assert sessions.epoch.learned(LONG_AGO)  # as if the server had restarted
    assert sessions.cache.between(sid, 0, 1) is None
    assert sessions.copies.take(sid) is None  # the copy of this process's own last save
    assert sessions.repository.cache is not cache
    assert sessions.epoch.learned(now)
    assert not sessions.epoch.learned(now)  # the same epoch again: nothing to drop


def test_a_page_read_before_a_restart_is_not_folded(runtime: Runtime) -> None:
    runtime.sessions.create_session(title="folded")
    read = ReadModels(runtime.db, runtime.settings, sessions=runtime.sessions)
    model = read_models("sessions")[0]
    view = model.postgres_view(read.events.datastore)
    expected = view.position(read.events.application_name)
    page = poll(lambda: read.events.read(expected, 100) or None, 30, "an event below the horizon")
    assert page.records and page.epoch is not None
    fold = Fold(view, model.projection(view), expected, read.events.decode(page.records))
    with pytest.raises(ServerRestarted):
        fold_together(read.events.datastore, [fold], LONG_AGO)
    assert view.position(read.events.application_name) == expected
    moved = fold_together(read.events.datastore, [fold], page.epoch)[0]
    assert moved > expected
    with psycopg.connect(runtime.db.conninfo) as conn:
        (started,) = conn.execute("SELECT pg_postmaster_start_time()").fetchone() or (None,)
    assert started == page.epoch


def test_every_step_makes_every_save_wait_for_the_disk(settings: Settings) -> None:
    strict = build_runtime(settings.model_copy(update={"durability": "every_step"}))
    try:
        saves = saves_of_a_turn(strict, '/tool echo {"text": "hi"}')
    finally:
        strict.close()
    # Nothing rides and nothing is held: the read-only outcome is saved alone.
    assert [topics for topics, _ in saves] == [
        ["TurnSubmitted"],
        ["TurnClaimed"],
        ["ModelReplied", "ToolCallStarted"],
        ["ToolCallSucceeded"],
        ["ModelReplied", "TurnCompleted"],
    ]
    assert not any(rode for _, rode in saves)
