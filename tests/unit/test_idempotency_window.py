"""A session remembers the idempotency keys of its last N keyed turns and of its open ones.

Inside the window a key keeps its meaning (the same message is the same turn,
another message is refused); a key that left it is a new turn. The window is
recorded in each ``TurnSubmitted``, so a replay forgets the same keys, and a
snapshot stored when every key was kept loads with only the window's.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest

from tests.unit.histories import WORKER, a_session
from turnlog.application.sessions import Sessions
from turnlog.domain import errors
from turnlog.domain.session import Session
from turnlog.domain.turns import IDEMPOTENCY_WINDOW


def _finish(session: Session, turn_id: str) -> None:
    claim = session.claim_turn(turn_id, WORKER)
    session.complete_turn(turn_id, claim, "ok")


def _keyed_turns(session: Session, keys: range, window: int) -> list[str]:
    """One finished turn per key (message ``m<key>``); their ids."""
    ids = []
    for n in keys:
        turn, created = session.submit_turn(f"m{n}", f"k{n}", idempotency_window=window)
        assert created
        _finish(session, turn.turn_id)
        ids.append(turn.turn_id)
    session.collect_events()
    return ids


def test_a_key_inside_the_window_keeps_its_turn_and_refuses_another_message() -> None:
    session = a_session(bounded=True)
    ids = _keyed_turns(session, range(5), window=5)

    for n, turn_id in enumerate(ids):
        repeat, created = session.submit_turn(f"m{n}", f"k{n}", idempotency_window=5)
        assert (repeat.turn_id, created) == (turn_id, False)
        with pytest.raises(errors.IdempotencyKeyReused):
            session.submit_turn("another message", f"k{n}", idempotency_window=5)
    assert session.pending_events == []


def test_a_key_that_left_the_window_is_a_new_turn() -> None:
    session = a_session(bounded=True)
    first = _keyed_turns(session, range(1), window=3)[0]
    _keyed_turns(session, range(1, 4), window=3)  # three later keyed turns push k0 out

    assert list(session.idempotency_keys) == ["k1", "k2", "k3"]
    assert list(session.idempotency_digests) == ["k1", "k2", "k3"]
    again, created = session.submit_turn("m0", "k0", idempotency_window=3)
    assert created and again.turn_id != first
    assert list(session.idempotency_keys) == ["k2", "k3", "k0"]  # newest again
    # A submission without a key forgets nothing.
    _finish(session, again.turn_id)
    plain, _ = session.submit_turn("no key", idempotency_window=3)
    assert list(session.idempotency_keys) == ["k2", "k3", "k0"] and plain.turn_id


def test_the_key_of_an_open_turn_is_never_forgotten() -> None:
    session = a_session(bounded=True)
    queued = []
    for n in range(4):  # one running, three queued behind it, window 2
        turn, _ = session.submit_turn(f"m{n}", f"k{n}", enqueue=True, idempotency_window=2)
        queued.append(turn.turn_id)
    assert list(session.idempotency_keys) == ["k0", "k1", "k2", "k3"]

    _finish(session, queued[0])
    _finish(session, queued[1])
    later, _ = session.submit_turn("m4", "k4", enqueue=True, idempotency_window=2)

    # k0 and k1 (finished) went; the open turns' keys stay, the newest counted in.
    assert list(session.idempotency_keys) == ["k2", "k3", "k4"]
    repeat, created = session.submit_turn("m2", "k2", enqueue=True, idempotency_window=2)
    assert (repeat.turn_id, created) == (queued[2], False)
    assert later.turn_id not in queued


def test_the_window_must_hold_a_key() -> None:
    session = a_session(bounded=True)
    with pytest.raises(errors.InvalidInput):
        session.submit_turn("hello", "k", idempotency_window=0)


def _replayed(app: Sessions, sid: UUID) -> Any:
    aggregate: Any = None
    for event in app.events.get(sid):
        aggregate = event.mutate(aggregate)
    return aggregate


def test_the_application_records_its_window_and_a_replay_forgets_the_same_keys() -> None:
    app = Sessions(
        env={"PERSISTENCE_MODULE": "eventsourcing.popo"}, snapshot_interval=7, idempotency_window=4
    )
    sid = app.create_session(title="t").session_id
    for n in range(12):
        tid = app.submit_turn(sid, f"m{n}", idempotency_key=f"k{n}").turn_id
        app.update(sid, lambda s, tid=tid: _finish(s, tid))

    loaded, replayed = app.get_session(sid), _replayed(app, sid)
    assert list(loaded.idempotency_keys) == ["k8", "k9", "k10", "k11"]
    assert loaded.__dict__ == replayed.__dict__
    assert all(
        e.idempotency_window == 4
        for e in app.events.get(sid)
        if isinstance(e, Session.TurnSubmitted)
    )
    assert app.submit_turn(sid, "m3", idempotency_key="k3").created  # left the window
    assert not app.submit_turn(sid, "m11", idempotency_key="k11").created


def test_a_snapshot_that_kept_every_key_loads_with_the_windows_keys() -> None:
    """A version-2 snapshot (stored before the window) held every key and digest."""
    app = Sessions(env={"PERSISTENCE_MODULE": "eventsourcing.popo"})
    session = a_session(bounded=True)
    total = IDEMPOTENCY_WINDOW + 30
    # As the earlier code kept them: every key, however many.
    ids = _keyed_turns(session, range(total), window=10**6)
    open_turn, _ = session.submit_turn("still open", "k-open", idempotency_window=10**6)
    session.collect_events()
    # Its oldest key is the open turn's: moved first, it must survive the upcast.
    keys = {"k-open": open_turn.turn_id, **session.idempotency_keys}
    digests = {"k-open": session.idempotency_digests["k-open"], **session.idempotency_digests}
    session.idempotency_keys, session.idempotency_digests = keys, digests
    snapshot = Session.Snapshot.take(session)
    snapshot.state["class_version"] = 2  # as the earlier code stored it
    assert len(snapshot.state["idempotency_keys"]) == total + 1

    stored = app.mapper.to_stored_event(snapshot)
    loaded: Any = app.mapper.to_domain_event(stored).mutate(None)

    kept = list(loaded.idempotency_keys)
    assert kept == ["k-open", *[f"k{n}" for n in range(31, total)]]
    assert list(loaded.idempotency_digests) == kept
    assert len(loaded.finished) == total and loaded.open_turn.turn_id == open_turn.turn_id
    repeat, created = loaded.submit_turn(f"m{total - 1}", f"k{total - 1}")
    assert (repeat.turn_id, created) == (ids[-1], False)
    with pytest.raises(errors.IdempotencyKeyReused):
        loaded.submit_turn("another", f"k{total - 1}")
    repeat, created = loaded.submit_turn("still open", "k-open", enqueue=True)
    assert (repeat.turn_id, created) == (open_turn.turn_id, False)
    new, created = loaded.submit_turn("m0", "k0", enqueue=True)  # k0 was forgotten
    assert created and new.turn_id != ids[0]
