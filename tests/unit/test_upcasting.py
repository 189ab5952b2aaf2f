"""Changing an event's payload without breaking the stored log: versioned topics and upcasting.

This is the recipe of docs/operations.md ("Upgrading"), on a small aggregate
so it runs without a database. Version 1 of ``Edited`` stored ``text``;
version 2 also records the ``editor``. The class gets the next topic
(``….Edited.v2``) and ``class_version = 2``; ``upcast_v1_v2`` turns a stored
version-1 payload into a version-2 one as it is read; the old topic is
registered to the same class, so the events already stored still decode.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any, cast
from uuid import uuid4

from eventsourcing.application import Application
from eventsourcing.domain import Aggregate
from eventsourcing.persistence import StoredEvent
from eventsourcing.utils import register_topic, resolve_topic

from turnlog.domain.session import Session

# Rows stored by an earlier version of turnlog (tests/integration/test_long_sessions.py).
OLD_STREAM = Path(__file__).resolve().parents[1] / "fixtures" / "old_shape_session.json"


class Note(Aggregate):
    """A note whose Edited event is at payload version 2."""

    TOPIC = "turnlog.example.Note.v1"

    class Created(Aggregate.Created):
        TOPIC = "turnlog.example.Note.Created.v1"
        text: str

    def __init__(self, text: str) -> None:
        self.text = text
        self.editor = ""

    @classmethod
    def write(cls, text: str) -> Note:
        return cls._create(cls.Created, id=uuid4(), text=text)

    def edit(self, text: str, editor: str) -> None:
        self.trigger_event(self.Edited, text=text, editor=editor)

    class Edited(Aggregate.Event):
        TOPIC = "turnlog.example.Note.Edited.v2"
        class_version = 2
        text: str
        editor: str

        @staticmethod
        def upcast_v1_v2(state: dict[str, Any]) -> None:
            # Version 1 did not record who edited: say so rather than invent a name.
            state["editor"] = "unknown (before v2)"

        def apply(self, aggregate: Any) -> None:
            note = cast(Note, aggregate)
            note.text = self.text
            note.editor = self.editor


# Events stored under the old topic decode as the current class (then upcast).
register_topic("turnlog.example.Note.Edited.v1", Note.Edited)


def store_version_1_edit(app: Application[Any], note: Note, text: str) -> None:
    """What version 1 of the code stored: its topic, its payload (no ``editor``)."""
    payload = {"timestamp": Note.Edited.create_timestamp(), "text": text}
    app.recorder.insert_events(
        [
            StoredEvent(
                originator_id=note.id,
                originator_version=note.version + 1,
                topic="turnlog.example.Note.Edited.v1",
                state=app.mapper.transcoder.encode(payload),
            )
        ]
    )


def test_an_old_payload_is_upcast_when_the_aggregate_is_read() -> None:
    app: Application[Any] = Application()  # in memory: the mapper is the same as in PostgreSQL
    note = Note.write("first")
    app.save(note)
    store_version_1_edit(app, note, "edited by version 1")

    replayed = cast(Note, app.repository.get(note.id))

    assert (replayed.text, replayed.editor) == ("edited by version 1", "unknown (before v2)")
    assert replayed.version == 2


def test_new_events_are_stored_under_the_new_topic_next_to_the_old_ones() -> None:
    app: Application[Any] = Application()
    note = Note.write("first")
    app.save(note)
    store_version_1_edit(app, note, "old")
    note = cast(Note, app.repository.get(note.id))
    note.edit("new", editor="ana")
    app.save(note)

    stored = list(app.recorder.select_events(note.id))
    assert [s.topic for s in stored] == [
        "turnlog.example.Note.Created.v1",
        "turnlog.example.Note.Edited.v1",
        "turnlog.example.Note.Edited.v2",
    ]
    assert app.mapper.transcoder.decode(stored[2].state)["class_version"] == 2
    replayed = cast(Note, app.repository.get(note.id))
    assert (replayed.text, replayed.editor) == ("new", "ana")


def test_every_stored_topic_of_a_session_is_explicit_and_versioned() -> None:
    topics = {
        name: getattr(value, "TOPIC", None)
        for name, value in vars(Session).items()
        if isinstance(value, type)
        and issubclass(value, Aggregate.Event | Session.Snapshot)
        and name != "Event"  # the base class, never stored
    }
    topics["Session"] = Session.TOPIC
    assert {"Created", "Started", "TurnSubmitted", "Snapshot"} <= set(topics)
    for name, topic in topics.items():
        assert topic and re.fullmatch(r"turnlog\.session\.\w+\.v\d+", topic), (name, topic)
        assert resolve_topic(topic) is (Session if name == "Session" else vars(Session)[name])


def test_a_renamed_event_class_reads_and_writes_the_topic_of_its_former_name() -> None:
    """``Session.Started`` and ``Session.Closed`` were ``SessionStarted`` and ``SessionClosed``.

    The topics keep the former names: a stream stored before the rename loads
    into the renamed classes, and new events are stored as before.
    """
    app: Application[Any] = Application()
    old = json.loads(OLD_STREAM.read_text())
    version, topic, state = old["sessions_events"][0]  # stored by the earlier code
    assert topic == "turnlog.session.SessionStarted.v1"
    session_id = uuid4()
    old_closed = {"timestamp": Session.Closed.create_timestamp(), "reason": "old", "actor": "ana"}
    app.recorder.insert_events(
        [
            StoredEvent(session_id, version, topic, base64.b64decode(state)),
            StoredEvent(
                session_id,
                version + 1,
                "turnlog.session.SessionClosed.v1",
                app.mapper.transcoder.encode(old_closed),
            ),
        ]
    )

    stored = list(app.recorder.select_events(session_id))
    assert [type(app.mapper.to_domain_event(s)) for s in stored] == [
        Session.Started,
        Session.Closed,
    ]
    replayed = cast(Session, app.repository.get(session_id))
    assert (replayed.title, replayed.closed, replayed.close_reason) == ("old shape", True, "old")

    new = Session.start(title="new")
    new.close("done", "ana")
    app.save(new)
    assert [s.topic for s in app.recorder.select_events(new.id)] == [
        "turnlog.session.SessionStarted.v1",
        "turnlog.session.SessionClosed.v1",
    ]


# Every topic the Session's events were stored under while they were nested in the aggregate.
STORED_TOPICS = [
    "turnlog.session.SessionStarted.v1",
    "TurnSubmitted.v1",
    "TurnClaimed.v1",
    "ModelReplied.v1",
    "ToolCallStarted.v1",
    "ToolCallProcessStarted.v1",
    "ToolCallSucceeded.v1",
    "ToolCallFailed.v1",
    "TurnCompleted.v1",
    "TurnFailed.v1",
    "TurnInterrupted.v1",
    "ToolCallResolved.v1",
    "TurnAbandoned.v1",
    "CancelRequested.v1",
    "TurnCancelled.v1",
    "ToolCallProposed.v1",
    "ToolCallApproved.v1",
    "ToolCallRejected.v1",
    "ContextCompacted.v1",
    "SessionClosed.v1",
    "ToolCallProbed.v1",
    "Snapshot.v1",
    "Snapshot.v2",
]


def test_every_topic_stored_before_the_events_moved_resolves_to_the_same_event() -> None:
    from turnlog.domain import events

    for short in STORED_TOPICS:
        topic = short if short.startswith("turnlog.") else f"turnlog.session.{short}"
        cls = resolve_topic(topic)
        name = short.split(".")[-2]
        expected = {"SessionStarted": "Started", "SessionClosed": "Closed"}.get(name, name)
        assert cls is getattr(Session, expected), topic
        if expected not in ("Started", "Snapshot"):
            assert cls is getattr(events, expected)  # defined in domain/events.py now
            assert topic == cls.TOPIC  # and stored under the same topic as before


def test_finished_turns_stored_as_positional_lists_load_as_typed_entries() -> None:
    from turnlog.domain.turns import FinishedEntry

    session = Session.start(title="typed")
    turn, _ = session.submit_turn("hello")
    claim = session.claim_turn(turn.turn_id, "w1")
    session.complete_turn(turn.turn_id, claim, "hi")
    snapshot = Session.Snapshot.take(session)
    state = dict(snapshot.state)
    state["finished"] = [list(e) for e in state["finished"]]  # as earlier versions stored them
    loaded = Session.Snapshot(
        originator_id=snapshot.originator_id,
        originator_version=snapshot.originator_version,
        timestamp=snapshot.timestamp,
        topic=snapshot.topic,
        state=state,
    ).mutate(None)

    [entry] = loaded.finished
    assert isinstance(entry, FinishedEntry)
    assert (entry.turn_id, entry.state, entry.call_ids) == (turn.turn_id, "completed", [])
    assert entry.first_version == 2 and entry.last_version == loaded.version
