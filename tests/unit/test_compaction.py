"""Context compaction: when it may happen, what it covers, what the request then holds.

Histories are random: finished turns of every kind, then an open turn taken
through its steps (calls requested, started, answered, interrupted,
resolved). At every step a compaction of every size is attempted; it must
be accepted exactly when the running turn has no unanswered call, and the
request built afterwards must answer every call it shows.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.histories import WORKER, a_call
from tests.unit.test_bounded_state import KINDS, _turn
from turnlog.application.providers.port import FixtureProvider
from turnlog.application.sessions import Sessions
from turnlog.domain import errors
from turnlog.domain.compaction import is_summarizing
from turnlog.domain.request import SUMMARY_NAME
from turnlog.domain.session import Session
from turnlog.domain.turns import Effect, TurnState

SUMMARY = "The codeword is tern."


def _do(app: Sessions, sid: UUID, command: str, *args: Any) -> Any:
    """Run one command of the session and save it; returns what the command returned."""
    return app.update(sid, lambda s: getattr(s, command)(*args))[0]


def _app() -> Sessions:
    return Sessions(env={"PERSISTENCE_MODULE": "eventsourcing.popo"}, snapshot_interval=7)


def _attempt(app: Sessions, sid: UUID, tid: str, claim: int) -> int:
    """Try every compaction size on a copy; returns the largest accepted (0: none)."""
    session = app.get_session(sid)
    turn = session.turn(tid)
    answered = all(c.settled for c in session.calls_of(turn))
    running = turn.state is TurnState.RUNNING and turn.worker_id != "" and turn.claim == claim
    accepted = 0
    for n in range(len(session.finished) + 2):
        copy = app.get_session(sid)
        try:
            copy.compact_context(tid, claim, SUMMARY, n, {"provider": "fixture"})
        except errors.DomainError:
            continue
        assert running and answered, "a compaction was accepted with a call unanswered"
        assert session.compacted_turns < n <= len(session.finished)
        _check_request(app, copy, tid)
        accepted = n
    if running and answered and len(session.finished) > session.compacted_turns:
        assert accepted == len(session.finished)
    return accepted


def _check_request(app: Sessions, session: Session, tid: str) -> None:
    """The request after a compaction: summary, the turns after it, every call answered."""
    request = app.request_for(session)
    names = [m.name for m in request.messages]
    assert names.count(SUMMARY_NAME) == 1
    asked = [c["call_id"] for m in request.messages for c in m.tool_calls]
    answered = [m.tool_call_id for m in request.messages if m.role == "tool"]
    assert sorted(asked) == sorted(answered)
    users = [m.content for m in request.messages if m.role == "user"]
    assert users[-1] == session.turn(tid).message  # the open turn is always sent whole
    assert len(users) == session.turn_count - session.compacted_turns


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kinds=st.lists(st.sampled_from(KINDS[:-1]), max_size=6),
    effects=st.lists(st.booleans(), min_size=2, max_size=2),
    ending=st.sampled_from(["succeed", "fail", "interrupt-resolve", "interrupt-abandon"]),
)
def test_a_compaction_never_happens_in_a_turn_with_an_unanswered_call(
    kinds: list[str], effects: list[bool], ending: str
) -> None:
    app = _app()
    sid = app.create_session(context_max_turns=2).session_id
    for n, kind in enumerate(kinds):
        _turn(app, sid, kind, n)
    tid = app.submit_turn(sid, "the open turn").turn_id
    claim = app.update(sid, lambda s: s.claim_turn(tid, WORKER))[0]
    _attempt(app, sid, tid, claim)
    calls = [a_call("x1", "echo"), a_call("x2", "echo")]
    app.update(sid, lambda s: s.record_model_reply(tid, claim, "", calls))
    _attempt(app, sid, tid, claim)  # two calls requested, none answered
    for i, call_id in enumerate(("x1", "x2")):
        effect = Effect.SIDE_EFFECTING if effects[i] else Effect.READ_ONLY
        _do(app, sid, "start_tool_call", tid, claim, call_id, WORKER, effect)
        _attempt(app, sid, tid, claim)  # in flight
        if call_id == "x2" and ending.startswith("interrupt") and effects[i]:
            app.update(sid, lambda s: s.interrupt_turn(tid, WORKER))
            _attempt(app, sid, tid, claim)  # outcome unknown
            if ending == "interrupt-abandon":
                app.update(sid, lambda s: s.abandon_turn(tid, "gave up", "ops"))
                return
            app.update(sid, lambda s: s.resolve_tool_call("x2", "failed", 0, "checked", "ops"))
            _attempt(app, sid, tid, claim)  # answered, but not claimed again yet
            claim = _do(app, sid, "claim_turn", tid, WORKER)
        elif ending == "fail" and call_id == "x2":
            _do(app, sid, "record_tool_failed", tid, claim, call_id, 1, "no")
        else:
            _do(app, sid, "record_tool_succeeded", tid, claim, call_id, 1, {"i": i})
        _attempt(app, sid, tid, claim)
    app.update(sid, lambda s: s.record_model_reply(tid, claim, "done", []))
    accepted = _attempt(app, sid, tid, claim)
    assert accepted == len(kinds)  # every finished turn may be summarised now
    if accepted:
        app.update(sid, lambda s: s.compact_context(tid, claim, SUMMARY, accepted, {}))
        assert app.get_session(sid).compacted_turns == accepted


def test_the_planner_covers_the_oldest_turns_and_keeps_about_half() -> None:
    app = _app()
    sid = app.create_session(context_max_turns=6).session_id
    for n in range(6):
        _turn(app, sid, "tool" if n % 2 else "complete", n)
    tid = app.submit_turn(sid, "seventh").turn_id
    app.update(sid, lambda s: s.claim_turn(tid, WORKER))

    planned = app.compaction_for(app.get_session(sid))

    assert planned is not None
    request, turns = planned
    assert is_summarizing(request) and turns == 6 - 5 // 2
    users = [m.content for m in request.messages if m.role == "user"]
    assert users == [f"message {n}" for n in range(turns)] + [request.messages[-1].content]
    assert request.tools == () and request.tools_chosen
    summary = FixtureProvider().complete(request).text
    assert "No codeword" in summary


def test_the_fixture_summary_carries_every_codeword_forward_latest_last() -> None:
    app = _app()
    sid = app.create_session(context_max_turns=1).session_id
    for n, word in enumerate(["heron", "kite", "heron", "owl"]):
        tid = app.submit_turn(sid, f"The codeword is {word}").turn_id
        claim = _do(app, sid, "claim_turn", tid, WORKER)
        planned = app.compaction_for(app.get_session(sid))
        if n:
            assert planned is not None
            text = FixtureProvider().complete(planned[0]).text
            _do(app, sid, "compact_context", tid, claim, text, planned[1], {})
        _do(app, sid, "complete_turn", tid, claim, "noted")

    summary = app.get_session(sid).compaction
    assert summary is not None
    assert summary["summary"].endswith("The codeword is kite. The codeword is heron.")


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"context_max_turns": 0}, "invalid_context_policy"),
        ({"context_max_chars": 999}, "invalid_context_policy"),
        ({"context_max_turns": True}, "invalid_context_policy"),
    ],
)
def test_a_context_policy_out_of_range_is_refused(fields: dict[str, Any], code: str) -> None:
    with pytest.raises(errors.InvalidInput) as refused:
        Session.start(**fields)
    assert refused.value.code == code


def test_an_oversized_summary_is_refused_and_nothing_is_recorded() -> None:
    app = _app()
    sid = app.create_session(context_max_turns=1).session_id
    _turn(app, sid, "complete", 0)
    tid = app.submit_turn(sid, "second").turn_id
    claim = app.update(sid, lambda s: s.claim_turn(tid, WORKER))[0]
    session = app.get_session(sid)

    with pytest.raises(errors.InvalidSummary):
        session.compact_context(tid, claim, "x" * (64 * 1024 + 1), 1, {})
    assert session.pending_events == []
