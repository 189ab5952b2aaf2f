"""Session.fork, purely: what its first event carries, and where it refuses to begin."""

from __future__ import annotations

import pytest

from tests.unit.histories import (
    a_call,
    a_completed_turn,
    a_queued_turn,
    a_reply_with_calls,
    a_running_turn,
    a_session,
    an_interrupted_turn,
)
from turnlog.domain import errors
from turnlog.domain.request import next_request
from turnlog.domain.session import Session, replay_turns
from turnlog.domain.turns import Effect

HEAD = "ab" * 32


def test_a_fork_is_asked_what_its_source_would_be_asked_and_counts_its_turns() -> None:
    source = a_session(tools=["echo"], tools_chosen=True, context_max_turns=5)
    a_completed_turn(source, "first", "one")
    turn_id = a_running_turn(source, "second")
    a_reply_with_calls(source, turn_id, a_call("c1", "echo", text="x"))
    claim = source.turn(turn_id).claim
    attempt = source.start_tool_call(turn_id, claim, "c1", "worker-a", Effect.READ_ONLY)
    source.record_tool_succeeded(turn_id, claim, "c1", attempt, {"text": "x"})
    source.record_model_reply(turn_id, claim, "done", [])
    source.complete_turn(turn_id, claim, "done")
    source.collect_events()

    fork = Session.fork(source, source, version=source.version, head=HEAD, title="copy")
    [event] = fork.collect_events()
    assert event.TOPIC == "turnlog.session.SessionForked.v1"
    assert (event.source_id, event.source_version, event.source_head) == (
        str(source.id),
        source.version,
        HEAD,
    )
    assert fork.forked_from == {
        "session_id": str(source.id),
        "version": source.version,
        "head": HEAD,
    }
    assert (fork.title, fork.turn_count, fork.turns) == ("copy", 2, [])  # bounded: entries only
    assert [e.first_version for e in fork.finished] == [1, 1]
    assert fork.context_max_turns == 5 and fork.tools_chosen and fork.tools == ["echo"]
    # Its earlier turns come back from its first event alone, as a range read gives them.
    assert next_request(fork, replay_turns(fork.id, [event])) == next_request(source)
    # The source's turns are copies: changing the fork's cannot reach the source.
    replay_turns(fork.id, [event]).turns[0].message = "changed"
    assert source.turns[0].message == "first"


@pytest.mark.parametrize("open_turn", ["queued", "running", "interrupted"])
def test_a_fork_inside_an_open_turn_is_refused_naming_it(open_turn: str) -> None:
    source = a_session()
    a_completed_turn(source)
    error: type[errors.Conflict] = errors.ForkInsideTurn
    if open_turn == "interrupted":
        turn_id = an_interrupted_turn(source)
        error = errors.ForkAtInterruptedTurn
    elif open_turn == "running":
        turn_id = a_running_turn(source)
    else:
        turn_id = a_queued_turn(source)
    with pytest.raises(error) as refused:
        Session.fork(source, source, version=source.version, head=HEAD)
    assert refused.value.extra["turn_id"] == turn_id
    assert refused.value.extra["state"] == open_turn


def test_a_closed_session_forks_into_an_open_one() -> None:
    source = a_session()
    a_completed_turn(source)
    source.close("done", "ops")
    source.collect_events()
    fork = Session.fork(source, source, version=source.version, head="")
    assert source.closed and not fork.closed and fork.status == "idle"
    fork.collect_events()
    _, created = fork.submit_turn("goes on")
    assert created and fork.turn_count == 2
