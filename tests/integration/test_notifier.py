"""A save someone waits on carries its own notification; the others coalesce on a thread."""

from __future__ import annotations

import logging
from typing import Any
from uuid import uuid4

import psycopg
import pytest
from eventsourcing.persistence import IntegrityError, StoredEvent
from psycopg import sql

from tests.deadlines import poll, scaled
from turnlog.application.runtime import Runtime
from turnlog.application.store.recorder import Hint, notice_of
from turnlog.application.store.topics import ENDING_MARK, WORK_MARK, deferrable
from turnlog.domain.session import Session


def _listen(runtime: Runtime) -> psycopg.Connection[Any]:
    conn = psycopg.connect(runtime.db.conninfo, autocommit=True)
    channel = runtime.sessions.recorder.channel_name  # type: ignore[attr-defined]
    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
    return conn


def _hints_until(conn: psycopg.Connection[Any], wanted: Hint) -> list[Hint]:
    seen: list[Hint] = []

    def arrived() -> bool:
        for notification in conn.notifies(timeout=0.2):
            notice = notice_of(notification.payload)
            seen.extend(notice.hints if notice is not None else [])
        return wanted in seen

    poll(arrived, scaled(10), f"a notification with {wanted}")
    return seen


def test_a_submitted_turn_is_notified_in_its_save_s_round_trip_with_the_news_held_back(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    notifier = runtime.sessions.recorder.notifier  # type: ignore[attr-defined]
    sid = runtime.sessions.create_session(title="notified").session_id
    poll(lambda: notifier.due_in is None, scaled(10), "earlier notifications to go out")
    by_thread: list[Any] = []
    monkeypatch.setattr(notifier, "_send", by_thread.append)
    notifier.defer = 3600.0
    with _listen(runtime) as other:
        notifier.notify([Session.ToolCallStarted.TOPIC])  # a step: held back for an hour
        assert notifier.due_in > 3000
        sent = notifier.sent

        submitted = runtime.sessions.submit_turn(sid, "hello")

        # Sent with the insert, after its commit: nothing is left due, no thread sent it.
        assert notifier.due_in is None and notifier.sent == sent + 1 and by_thread == []
        _hints_until(other, Hint(sid, WORK_MARK, submitted.version))


def test_a_turn_its_submitter_runs_is_notified_once_at_its_end_with_no_work_hint(
    runtime: Runtime,
) -> None:
    notifier = runtime.sessions.recorder.notifier  # type: ignore[attr-defined]
    sid = runtime.sessions.create_session(title="sent").session_id
    poll(lambda: notifier.due_in is None, scaled(10), "earlier notifications to go out")
    notifier.defer = 3600.0  # a deferred save's notification waits for the turn's end
    with _listen(runtime) as other:
        sent = notifier.sent
        submitted, turn = runtime.executor.submit_and_run(sid, "hello")
        assert turn is not None and turn.state == "completed"
        assert notifier.sent == sent + 1 and notifier.due_in is None  # the end's, in its save
        end = Hint(sid, ENDING_MARK, runtime.sessions.get_session(sid).version)
        seen = _hints_until(other, end)
    # The submission and its claim hold no turn for a worker to take: no work hint.
    assert [h for h in seen if h.session_id == sid] == [end]
    assert submitted.created


def test_a_refused_save_gives_the_news_it_carried_back_and_its_connection_stays_usable(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = runtime.sessions.recorder
    notifier = recorder.notifier  # type: ignore[attr-defined]
    sid = runtime.sessions.create_session(title="refused").session_id
    poll(lambda: notifier.due_in is None, scaled(10), "earlier notifications to go out")
    held, waiting = uuid4(), Session.TurnSubmitted.TOPIC
    # News of an earlier save, held back (as a step's would be) when the refused save takes it.
    monkeypatch.setattr(notifier, "deferrable", lambda topics: set(topics) <= {waiting})
    notifier.defer = 3600.0
    notifier.notify([waiting], [held], [7])
    monkeypatch.setattr(notifier, "deferrable", deferrable)
    with _listen(runtime) as other:
        taken = StoredEvent(sid, 1, Session.TurnCompleted.TOPIC, b"{}")  # version 1 is taken
        with caplog.at_level(logging.WARNING, logger="psycopg.pool"), pytest.raises(IntegrityError):
            recorder.insert_events([taken])

        seen = _hints_until(other, Hint(held, WORK_MARK, 7))  # given back, sent at once
        assert not any(h.session_id == sid and ENDING_MARK in h.marks for h in seen)
    assert notifier.due_in is None
    # The failed transaction was ended before the connection went back to the pool.
    assert not [r for r in caplog.records if r.name == "psycopg.pool"]
    # The pool's connections are clean: the next saves go through.
    again = runtime.sessions.submit_turn(sid, "after the refusal")
    assert runtime.sessions.turn_record(sid, again.turn_id)[1].state == "queued"
