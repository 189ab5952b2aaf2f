"""A session keeps what decisions need, not the whole past; snapshots hold only that.

Histories are random sequences of whole and unfinished turns, driven through
the Sessions application on in-memory persistence (same mapper and snapshot
code as on PostgreSQL), so the snapshot-loaded session can be compared with a
replay of every event.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.histories import WORKER, a_call, a_session
from turnlog.application.sessions import Sessions
from turnlog.domain import errors
from turnlog.domain.session import Session
from turnlog.domain.turns import Effect, FinishedEntry, FinishedTurn, TurnState, entries_from_lists

KINDS = ("complete", "tool", "fail", "abandon", "resolve", "open")


def _turn(app: Sessions, sid: UUID, kind: str, n: int) -> None:
    """Drive one turn of ``kind``; 'open' leaves it running with a call in flight."""
    submitted = app.submit_turn(sid, f"message {n}", idempotency_key=f"k{n}" if n % 2 else "")
    tid = submitted.turn_id
    claim = app.update(sid, lambda s: s.claim_turn(tid, WORKER))[0]
    if kind == "complete":
        app.update(sid, lambda s: s.record_model_reply(tid, claim, "ok", []))
        app.update(sid, lambda s: s.complete_turn(tid, claim, "ok"))
        return
    call = a_call(f"c{n}", "echo", text=str(n))
    app.update(sid, lambda s: s.record_model_reply(tid, claim, "", [call]))
    effect = Effect.SIDE_EFFECTING if kind in ("abandon", "resolve", "open") else Effect.READ_ONLY
    app.update(sid, lambda s: s.start_tool_call(tid, claim, f"c{n}", WORKER, effect))
    if kind == "open":
        return
    if kind == "fail":
        app.update(sid, lambda s: s.fail_turn(tid, claim, "boom"))
    elif kind == "tool":
        app.update(sid, lambda s: s.record_tool_succeeded(tid, claim, f"c{n}", 1, {"n": n}))
        app.update(sid, lambda s: s.record_model_reply(tid, claim, "done", []))
        app.update(sid, lambda s: s.complete_turn(tid, claim, "done"))
    else:
        app.update(sid, lambda s: s.interrupt_turn(tid, WORKER))
        if kind == "abandon":
            app.update(sid, lambda s: s.abandon_turn(tid, "gave up", "ops"))
        else:
            app.update(sid, lambda s: s.resolve_tool_call(f"c{n}", "succeeded", 1, "ok", "ops"))
            claim = app.update(sid, lambda s: s.claim_turn(tid, WORKER))[0]
            app.update(sid, lambda s: s.complete_turn(tid, claim, "resolved"))


def _replayed(app: Sessions, sid: UUID) -> Any:
    aggregate: Any = None
    for event in app.events.get(sid):
        aggregate = event.mutate(aggregate)
    return aggregate


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kinds=st.lists(st.sampled_from(KINDS[:-1]), max_size=12),
    last_open=st.booleans(),
    interval=st.integers(min_value=2, max_value=9),
)
def test_the_snapshot_loaded_session_equals_a_replay_of_its_events(
    kinds: list[str], last_open: bool, interval: int
) -> None:
    app = Sessions(env={"PERSISTENCE_MODULE": "eventsourcing.popo"}, snapshot_interval=interval)
    sid = app.create_session(title="t").session_id
    for n, kind in enumerate([*kinds, "open"] if last_open else kinds):
        _turn(app, sid, kind, n)

    loaded, replayed = app.get_session(sid), _replayed(app, sid)

    assert loaded.__dict__ == replayed.__dict__
    assert loaded.turn_count == len(kinds) + last_open
    assert len(loaded.turns) == int(last_open)  # only the open turn is kept in full
    assert sum(loaded.counts.values()) == len(loaded.finished) == len(kinds)


def test_a_finished_turn_leaves_a_summary_with_the_version_range_of_its_events() -> None:
    session = a_session(bounded=True)
    turn, _ = session.submit_turn("hello")
    session.claim_turn(turn.turn_id, WORKER)
    session.record_model_reply(turn.turn_id, 1, "", [a_call("c1", "echo", text="x")])
    session.start_tool_call(turn.turn_id, 1, "c1", WORKER, Effect.READ_ONLY)
    session.record_tool_succeeded(turn.turn_id, 1, "c1", 1, {"text": "x"})
    session.complete_turn(turn.turn_id, 1, "done")

    assert session.turns == [] and session.calls == {}
    assert session.finished_turns() == [
        FinishedTurn(turn.turn_id, TurnState.COMPLETED, 2, 7, ("c1",))
    ]
    assert session.turn_state(turn.turn_id) is TurnState.COMPLETED
    assert session.last_turn == session.finished_turns()[0]


def test_rules_about_finished_turns_still_hold_without_their_content() -> None:
    session = a_session(bounded=True)
    turn, _ = session.submit_turn("hello", idempotency_key="k")
    session.claim_turn(turn.turn_id, WORKER)
    session.record_model_reply(turn.turn_id, 1, "", [a_call("c1", "echo")])
    session.start_tool_call(turn.turn_id, 1, "c1", WORKER, Effect.READ_ONLY)
    session.record_tool_succeeded(turn.turn_id, 1, "c1", 1, {})
    session.complete_turn(turn.turn_id, 1, "done")
    session.collect_events()

    repeat, created = session.submit_turn("hello", idempotency_key="k")
    assert (repeat.turn_id, created) == (turn.turn_id, False)
    with pytest.raises(errors.IdempotencyKeyReused):
        session.submit_turn("something else", idempotency_key="k")
    with pytest.raises(errors.InvalidTransition):
        session.claim_turn(turn.turn_id, WORKER)
    with pytest.raises(errors.InvalidTransition):
        session.resolve_tool_call("c1", "succeeded", 1, "note", "ops")
    second, _ = session.submit_turn("again")
    session.claim_turn(second.turn_id, WORKER)
    with pytest.raises(errors.DuplicateToolCall):  # a call id stays unique in the session
        session.record_model_reply(second.turn_id, 1, "", [a_call("c1", "echo")])
    assert session.pending_events and all(
        not isinstance(e, Session.ModelReplied) for e in session.pending_events
    )


def test_a_snapshot_entry_comes_back_as_stored_or_is_refused_without_its_five_fields() -> None:
    stored = [["t1", "completed", 2, 8, ["c1"]], ["t2", "failed", 9, 12, []]]
    entries = entries_from_lists(stored)
    assert entries == [FinishedEntry(*e) for e in stored]
    assert all(type(e) is FinishedEntry for e in entries)
    for short_or_long in (["t1", "completed", 2, 8], ["t1", "completed", 2, 8, [], 0]):
        with pytest.raises(ValueError):
            entries_from_lists([short_or_long])
