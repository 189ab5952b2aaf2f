"""The read models' folds agree with the aggregate's own state transitions (no database).

Each generated session goes through every kind of turn ending (completed,
tool succeeded or failed, turn failed with a call pending, interrupted then
resolved, interrupted then abandoned) in different orders; its events are
folded by the same projection code the runners use, into in-memory views.
"""

from __future__ import annotations

import pytest
from eventsourcing.persistence import Tracking

from tests.histories import bulk_session
from turnlog.application.sessions import Sessions
from turnlog.projections import read_models
from turnlog.projections.audit import disagreements


@pytest.mark.parametrize("index", range(6))
def test_every_read_model_agrees_with_the_replayed_session(index: int) -> None:
    session = bulk_session(index, turns=7)
    events = session.collect_events()
    views = {model.name: model.memory_view() for model in read_models()}
    projections = [model.projection(views[model.name]) for model in read_models()]
    for position, event in enumerate(events, start=1):
        for projection in projections:
            projection.process_event(event, Tracking(Sessions.name, position))

    for name, view in views.items():
        assert disagreements(name, session, view.rows.all()) == [], name
    [row] = views["sessions"].rows.all()
    assert (row["version"], row["last_position"]) == (session.version, len(events))
    states = {r["state"] for r in views["tool_calls"].rows.all()}
    assert {"succeeded", "failed", "resolved", "abandoned"} <= states
