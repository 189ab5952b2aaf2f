"""Which saves may ride on the next flush (domain.durability) and where a reader goes back to."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from turnlog.application.store.logorder import Place
from turnlog.application.store.restart import Places
from turnlog.domain import events
from turnlog.domain.durability import may_ride
from turnlog.domain.turns import ToolCall


def event(cls: Any, **fields: Any) -> Any:
    base: dict[str, Any] = {
        "originator_id": UUID(int=1),
        "originator_version": 2,
        "timestamp": datetime.now(UTC),
    }
    return cls(**base, **fields)


def call(effect: str) -> ToolCall:
    return ToolCall(call_id="c1", name="t", arguments={}, turn_id="t1", step=1, effect=effect)


CLAIM = event(events.TurnClaimed, turn_id="t1", worker_id="w", claim=1)
ASKS = event(
    events.ModelReplied,
    turn_id="t1",
    step=1,
    text="",
    tool_calls=[{"call_id": "c1", "name": "t", "arguments": {}}],
    usage={},
)
FINAL = event(events.ModelReplied, turn_id="t1", step=2, text="hi", tool_calls=[], usage={})
SUCCEEDED = event(events.ToolCallSucceeded, turn_id="t1", call_id="c1", attempt=1, result="r")
FAILED = event(events.ToolCallFailed, turn_id="t1", call_id="c1", attempt=1, error="e")
COMPLETED = event(events.TurnCompleted, turn_id="t1", reply="hi")
STARTED = event(
    events.ToolCallStarted,
    turn_id="t1",
    call_id="c1",
    attempt=1,
    worker_id="w",
    claim=1,
    effect="read_only",
)


def test_a_claim_and_a_reply_asking_for_tools_ride() -> None:
    assert may_ride({}, [CLAIM])
    assert may_ride({}, [ASKS])
    assert may_ride({}, [CLAIM, ASKS])


def test_an_outcome_rides_only_when_its_call_is_safe_to_repeat() -> None:
    for effect in ("read_only", "idempotent"):
        assert may_ride({"c1": call(effect)}, [SUCCEEDED])
        assert may_ride({"c1": call(effect)}, [FAILED])
    assert not may_ride({"c1": call("side_effecting")}, [SUCCEEDED])
    assert not may_ride({"c1": call("side_effecting")}, [FAILED])
    assert not may_ride({"c1": call("")}, [SUCCEEDED])  # no effect recorded: durable
    assert not may_ride({}, [SUCCEEDED])  # a call not known


def test_intents_ends_and_final_replies_are_durable_and_make_a_whole_save_durable() -> None:
    assert not may_ride({"c1": call("read_only")}, [STARTED])
    assert not may_ride({}, [FINAL, COMPLETED])
    assert not may_ride({}, [FINAL])
    assert not may_ride({}, [CLAIM, COMPLETED])
    assert not may_ride({}, [])


def test_a_reader_goes_back_to_a_place_reached_long_enough_before_the_last() -> None:
    places = Places(0.6, (0.0, Place(0, 0)))
    for at, position in ((1.0, 10), (2.0, 20), (2.5, 25), (3.0, 30)):
        places.append((at, Place(1, position)))
    # keep = 0.6 + 1.0 s: the newest reached at or before 3.0 - 1.6 = 1.4 is position 10.
    assert places.durable() == Place(1, 10)
    places.append((10.0, Place(1, 40)))
    assert places.durable() == Place(1, 30)


def test_a_reader_with_nothing_old_enough_goes_back_to_where_it_began() -> None:
    places = Places(0.6, (5.0, Place(3, 7)))
    places.append((5.5, Place(3, 9)))
    assert places.durable() == Place(3, 7)
