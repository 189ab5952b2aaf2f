"""Version ranges for turns upcast from a version-1 snapshot.

Snapshots of the first version kept no version ranges for their turns. A
session loaded from one gets them from the first and last events of each turn,
read by topic from its own stream (once per load, and only for such sessions).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from eventsourcing.persistence import StoredEvent

from turnlog.application.store import session_log
from turnlog.domain.session import Session

TOPICS = [
    Session.TurnSubmitted.TOPIC,
    Session.TurnCompleted.TOPIC,
    Session.TurnFailed.TOPIC,
    Session.TurnAbandoned.TOPIC,
]


def complete(app: Any, session: Session) -> None:
    """Give ``session``'s turns their ranges, read from ``app``'s stream, if they lack them."""
    if unknown(session):
        fill(session, events_of_topics(app, session.id, TOPICS))


def events_of_topics(app: Any, session_id: Any, topics: list[str]) -> list[Any]:
    """The session's events of ``topics``, decoded, in version order."""
    return [
        app.mapper.to_domain_event(
            StoredEvent(
                session_id, int(r["originator_version"]), str(r["topic"]), bytes(r["state"])
            )
        )
        for r in session_log.rows_of_topics(app.recorder, session_id, topics)
    ]


def unknown(session: Session) -> bool:
    """True for a session upcast from a version-1 snapshot whose turns lack version ranges."""
    return bool(
        (session.finished and not session.finished[0].first_version)
        or any(not t.first_version for t in session.turns)
    )


def fill(session: Session, events: Iterable[Any]) -> None:
    """Give the session's turns their ranges from its events of ``TOPICS``."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for event in events:
        turn_id = str(event.turn_id)
        target = first if isinstance(event, Session.TurnSubmitted) else last
        target[turn_id] = event.originator_version
    session.finished = [
        e
        if e.first_version
        else e._replace(first_version=first.get(e.turn_id, 0), last_version=last.get(e.turn_id, 0))
        for e in session.finished
    ]
    for turn in session.turns:
        turn.first_version = turn.first_version or first.get(turn.turn_id, 0)
