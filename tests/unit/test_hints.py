"""A notification's payload: the hints another process acts on before it reads the log."""

from __future__ import annotations

from uuid import uuid4

import pytest

from turnlog.application.store.recorder import MAX_PAYLOAD, Hint, Notice, notice_of, payload_of
from turnlog.application.store.topics import (
    ENDING_MARK,
    ENDING_TOPICS,
    HINT_MARKS,
    STEP_TOPICS,
    WORK_MARK,
    WORK_TOPICS,
    claimed_submission,
    deferrable,
)
from turnlog.domain.session import Session

ORIGIN = "0123456789abcdef"


def test_hints_come_back_as_they_were_sent_with_their_sender() -> None:
    hints = [Hint(uuid4(), "w", 7), Hint(uuid4(), "we", 12), Hint(uuid4(), "e", 1)]

    assert notice_of(payload_of(ORIGIN, hints)) == Notice(ORIGIN, hints)


def test_a_notification_with_no_news_tells_that_there_is_none() -> None:
    assert payload_of(ORIGIN, []) == f"1 {ORIGIN}"
    assert notice_of(f"1 {ORIGIN}") == Notice(ORIGIN, [])


@pytest.mark.parametrize(
    "payload",
    [
        "",  # an older writer's NOTIFY, or too many hints for one payload
        "1",  # no sender
        "1 " + "7" * 32 + ":w:1",  # a hint where the sender belongs
        f"2 {ORIGIN} " + "7" * 32 + ":w:1",  # a format this version does not know
        f"1 {ORIGIN} not-a-session:w:1",
        f"1 {ORIGIN} " + "7" * 32 + ":w:seven",
        f"1 {ORIGIN} " + "7" * 32 + ":w",
    ],
)
def test_a_payload_that_tells_nothing_certain_is_read_as_no_hints(payload: str) -> None:
    assert notice_of(payload) is None  # the listener reads the log to know


def test_more_hints_than_one_payload_holds_send_none() -> None:
    many = [Hint(uuid4(), "we", 1_000_000) for _ in range(MAX_PAYLOAD // 40)]

    payload = payload_of(ORIGIN, many)

    assert payload == "" and notice_of(payload) is None
    assert len(payload_of(ORIGIN, many[:100]).encode()) < 8000  # what PostgreSQL accepts


def test_work_and_turn_ends_are_marked_and_a_turn_s_middle_steps_are_not() -> None:
    assert HINT_MARKS[Session.TurnSubmitted.TOPIC] == WORK_MARK
    assert HINT_MARKS[Session.TurnCompleted.TOPIC] == ENDING_MARK
    # A turn cancelled at once both ends it and may start the one queued behind it.
    assert HINT_MARKS[Session.TurnCancelled.TOPIC] == WORK_MARK + ENDING_MARK
    assert set(HINT_MARKS) == WORK_TOPICS | ENDING_TOPICS
    assert not set(HINT_MARKS) & STEP_TOPICS  # deferred saves carry no news


def test_a_submission_waits_for_its_notification_only_when_claimed_in_its_own_save() -> None:
    submitted, claimed = Session.TurnSubmitted.TOPIC, Session.TurnClaimed.TOPIC
    replied, completed = Session.ModelReplied.TOPIC, Session.TurnCompleted.TOPIC
    assert deferrable([claimed]) and deferrable([replied, Session.ToolCallStarted.TOPIC])
    assert deferrable([submitted, claimed])  # its submitter runs it: no news for others
    assert not deferrable([submitted])  # a worker waits for it
    assert not deferrable([replied, completed])  # a turn's end: waited on
    assert not deferrable([submitted, claimed, replied, completed])
    assert not deferrable([])
    # …and carries no hint: there is no turn in it for a worker to take.
    assert claimed_submission([submitted, claimed])
    assert not claimed_submission([submitted]) and not claimed_submission([claimed])
    assert not claimed_submission([submitted, claimed, replied, completed])
