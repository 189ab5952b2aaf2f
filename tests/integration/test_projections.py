"""Read models against a real PostgreSQL: exact rows, live latency, queries, status."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from eventsourcing.persistence import Tracking

from tests.deadlines import poll, scaled
from tests.histories import WORKER, Scripted, scripted_history
from turnlog.application.errors import (
    InvalidCursor,
    InvalidQuery,
    ProjectionBusy,
    ProjectionConflict,
    UnknownProjection,
)
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.application.store.logorder import place_of_tracking
from turnlog.domain.session import Session
from turnlog.projections import ProjectionSupervisor, ReadModels, read_models
from turnlog.projections.audit import disagreements
from turnlog.projections.rebuild import holding_locks, rebuild, verify
from turnlog.projections.sessions_view import SessionsProjection
from turnlog.projections.view import Fold, PostgresReadModelView, scopes_of


@pytest.fixture
def read(runtime: Runtime) -> Iterator[ReadModels]:
    models = ReadModels(runtime.db, runtime.settings, sessions=runtime.sessions)
    yield models


@pytest.fixture
def supervisor(runtime: Runtime) -> Iterator[ProjectionSupervisor]:
    sup = ProjectionSupervisor(
        runtime.settings, runtime.db, sessions=runtime.sessions, poll_interval=0.2
    )
    sup.start()
    yield sup
    sup.stop()


def rows_by(page: tuple[list[dict[str, Any]], str | None], key: str) -> dict[str, dict[str, Any]]:
    items, following = page
    assert following is None
    return {row[key]: row for row in items}


def test_read_models_hold_exactly_the_rows_the_history_implies(
    runtime: Runtime, supervisor: ProjectionSupervisor, read: ReadModels
) -> None:
    h = scripted_history(runtime)
    assert read.wait_for(h.last_position, timeout=scaled(10))

    sessions = rows_by(read.list_sessions(limit=100), "title")
    assert {
        t: (r["status"], r["turn_count"], r["last_turn_state"]) for t, r in sessions.items()
    } == {
        "done": ("idle", 4, "failed"),
        "blocked": ("blocked", 1, "interrupted"),
        "abandoned": ("idle", 1, "abandoned"),
        "resolved": ("idle", 1, "completed"),
        "queued": ("busy", 1, "queued"),
        "pending": ("busy", 1, "running"),
        "started": ("busy", 1, "running"),
        "closed": ("closed", 1, "completed"),
    }
    assert sessions["blocked"]["unknown_call_ids"] == [h.calls["unknown"]]
    assert sessions["closed"]["last_position"] == h.last_position

    turns = rows_by(read.list_open_turns(limit=100), "turn_id")
    assert {t: (r["state"], r["worker_id"], r["unknown_call_ids"]) for t, r in turns.items()} == {
        h.turns["interrupted"]: ("interrupted", "", [h.calls["unknown"]]),
        h.turns["queued"]: ("queued", "", []),
        h.turns["pending"]: ("running", WORKER, []),
        h.turns["started"]: ("running", WORKER, []),
    }
    assert turns[h.turns["interrupted"]]["previous_worker"] == WORKER
    assert (read.count_open_turns(), read.count_open_turns("running")) == (4, 2)

    calls = rows_by(read.list_tool_calls(limit=100), "call_id")
    assert {c: r["state"] for c, r in calls.items()} == {
        h.calls["succeeded"]: "succeeded",
        h.calls["failed"]: "failed",
        h.calls["not_run"]: "failed",
        h.calls["unknown"]: "unknown",
        h.calls["abandoned"]: "abandoned",
        h.calls["abandoned_pending"]: "failed",
        h.calls["resolved"]: "resolved",
        h.calls["pending"]: "pending",
        h.calls["started"]: "started",
    }
    succeeded = calls[h.calls["succeeded"]]
    assert (succeeded["tool"], succeeded["effect"], succeeded["attempt"]) == (
        "echo",
        "read_only",
        1,
    )
    assert succeeded["result_summary"] == '{"text": "x"}'
    assert (
        succeeded["duration_seconds"] >= 0 and succeeded["finished_at"] >= succeeded["started_at"]
    )
    assert "must be of type number" in calls[h.calls["failed"]]["error_summary"]
    assert calls[h.calls["not_run"]]["error_summary"].startswith("not run: turn failed:")
    assert (
        calls[h.calls["abandoned_pending"]]["error_summary"] == "not run: turn abandoned: gave up"
    )
    assert calls[h.calls["resolved"]]["outcome"] == "succeeded"
    assert calls[h.calls["pending"]]["started_at"] is None
    assert calls[h.calls["started"]]["finished_at"] is None

    assert_agrees_with_aggregates(runtime, read, h)
    assert all(result.ok for result in verify(read.events, read_models()))


def assert_agrees_with_aggregates(runtime: Runtime, read: ReadModels, h: Scripted) -> None:
    """Every read model's rows for every session agree with the replayed aggregate."""
    for sid in h.sessions.values():
        session = runtime.sessions.get_record(sid)  # every turn in full, as audit replays it
        for model in read_models():
            view = model.postgres_view(read.events.datastore)
            _, rows = view.snapshot(read.events.application_name, {"session_id": sid})
            assert disagreements(model.name, session, rows) == [], (model.name, session.title)


def test_a_live_runner_reflects_each_new_event(
    runtime: Runtime, supervisor: ProjectionSupervisor, read: ReadModels
) -> None:
    # How soon is figure 7's question (make bench). The waits allow for another
    # test's transaction holding the commit horizon back for seconds (test_log_order).
    assert read.wait_for(read.events.head(), timeout=scaled(10))  # the runners are active
    written = runtime.sessions.create_session(title="fresh")
    assert read.wait_for(written.position, timeout=scaled(10))
    [row], _ = read.list_sessions(limit=1)
    assert (row["session_id"], row["title"]) == (str(written.session_id), "fresh")

    submitted = runtime.sessions.submit_turn(written.session_id, "hello")
    assert read.wait_for(submitted.position, timeout=scaled(10), names=["open_turns"])
    [turn], _ = read.list_open_turns(state="queued")
    assert turn["turn_id"] == submitted.turn_id


def test_runners_catch_up_by_polling_when_no_notification_comes(
    runtime: Runtime, read: ReadModels
) -> None:
    with ProjectionSupervisor(
        runtime.settings, runtime.db, sessions=runtime.sessions, listen=False, poll_interval=0.2
    ):
        written = runtime.sessions.create_session(title="polled")
        assert read.wait_for(written.position, timeout=scaled(10))


def test_when_start_returns_every_read_model_is_led_or_stood_by(runtime: Runtime) -> None:
    sup = ProjectionSupervisor(
        runtime.settings, runtime.db, ["sessions", "open_turns"], sessions=runtime.sessions
    )
    with holding_locks(runtime.db, runtime.settings.namespace, read_models("open_turns")), sup:
        # What /readyz reports from the moment the process says it has started.
        states = {r["name"]: r["state"] for r in sup.runners()}
        assert states == {"sessions": "active", "open_turns": "standby"}


def test_one_write_moves_every_read_model_in_one_commit(
    runtime: Runtime, supervisor: ProjectionSupervisor, read: ReadModels
) -> None:
    written = runtime.sessions.create_session(title="one event")
    assert read.wait_for(written.position, timeout=scaled(5))
    # Each runner state moves after its commit is counted.
    poll(
        lambda: all(r["position"] == written.position for r in supervisor.runners()),
        scaled(5),
        "every read model's runner at the event",
    )
    assert len(supervisor.runners()) == 3
    assert supervisor.commits() == 1  # not one per read model


def test_a_read_model_far_behind_catches_up_without_holding_the_others_back(
    runtime: Runtime, read: ReadModels
) -> None:
    for number in range(600):
        runtime.sessions.create_session(title=f"early {number}")
    sup = ProjectionSupervisor(
        runtime.settings, runtime.db, sessions=runtime.sessions, batch_size=5, poll_interval=0.2
    )
    others = ["open_turns", "tool_calls"]
    with holding_locks(runtime.db, runtime.settings.namespace, read_models("sessions")), sup:
        # Another process leads `sessions` meanwhile; this one leads the others.
        head = runtime.sessions.create_session(title="head")
        assert read.wait_for(head.position, timeout=scaled(30), names=others)
    with sup:
        # Let go: this process takes `sessions` over, 601 events behind.
        poll(
            lambda: {r["name"]: r["state"] for r in sup.runners()}["sessions"] == "active",
            scaled(10),
            "this process to lead sessions",
            every=0.005,
        )
        late = runtime.sessions.create_session(title="late")
        assert read.wait_for(late.position, timeout=scaled(10), names=others)
        assert read.places(["sessions"])["sessions"] < read.events.place_of(late.position)
        assert read.wait_for(late.position, timeout=scaled(30), names=["sessions"])
    assert read.list_sessions(limit=1)[0][0]["title"] == "late"


class _Poisoned(SessionsProjection):
    """The sessions read model, unable to fold the start of a session titled "poison"."""

    name = SessionsProjection.name  # the same tables (the library names them after the class)

    def process_event(self, domain_event: Any, tracking: Tracking) -> None:
        if isinstance(domain_event, Session.Started) and domain_event.title == "poison":
            raise ValueError("cannot fold this one")
        super().process_event(domain_event, tracking)


def test_an_event_one_read_model_cannot_fold_stops_only_that_read_model(
    runtime: Runtime, read: ReadModels
) -> None:
    sup = ProjectionSupervisor(
        runtime.settings, runtime.db, sessions=runtime.sessions, poll_interval=0.2
    )
    sup.models = [
        replace(m, projection=_Poisoned) if m.name == "sessions" else m for m in sup.models
    ]
    with sup:
        fine = runtime.sessions.create_session(title="fine")
        assert read.wait_for(fine.position, timeout=scaled(5))
        poison = runtime.sessions.create_session(title="poison")
        after = runtime.sessions.create_session(title="after")
        # The other two fold past it (they were in the same transaction first).
        assert read.wait_for(after.position, timeout=scaled(5), names=["open_turns", "tool_calls"])
        states = {
            r["name"]: r
            for r in poll(
                lambda: [r for r in sup.runners() if r["restarts"] >= 2] and sup.runners(),
                scaled(10),
                "the sessions read model to fail twice",
            )
        }
        assert "cannot fold this one" in states["sessions"]["last_error"]
        assert states["open_turns"]["restarts"] == states["tool_calls"]["restarts"] == 0
        assert states["open_turns"]["state"] == states["tool_calls"]["state"] == "active"
    places = read.places(["sessions"])
    assert places["sessions"] < read.events.place_of(poison.position)
    assert [row["title"] for row in read.list_sessions()[0]] == ["fine"]


def test_lists_page_by_cursor_and_refuse_malformed_input(
    runtime: Runtime, read: ReadModels
) -> None:
    ids = [runtime.sessions.create_session(title=f"s{i}").session_id for i in range(5)]
    rebuild(read.events, runtime.db, runtime.settings.namespace, read_models())
    seen: list[str] = []
    cursor = None
    for _ in range(3):
        items, cursor = read.list_sessions(limit=2, cursor=cursor)
        seen += [row["session_id"] for row in items]
    assert cursor is None
    assert seen == [str(i) for i in reversed(ids)]  # newest activity first

    turns_cursor = read.list_open_turns(limit=1)[1]
    for bad in ("garbage!", "eyJ4IjoxfQ", "W10", read.list_sessions(limit=1)[1]):
        with pytest.raises(InvalidCursor):
            read.list_tool_calls(cursor=bad)
    assert turns_cursor is None
    with pytest.raises(InvalidQuery):
        read.list_sessions(status="sleeping")
    with pytest.raises(InvalidQuery):
        read.list_open_turns(limit=0)
    with pytest.raises(InvalidQuery):
        read.list_tool_calls(session_id="not-a-uuid")
    with pytest.raises(UnknownProjection):
        read.wait_for(1, timeout=0, names=["nope"])
    assert read.list_tool_calls(session_id=str(ids[0]), tool="echo", status="failed") == ([], None)


def test_status_reports_position_lag_and_the_runner_that_holds_each_read_model(
    runtime: Runtime, read: ReadModels
) -> None:
    written = runtime.sessions.create_session(title="lagging")
    before = {s["name"]: s for s in read.status()}
    assert before["sessions"]["position"] == 0
    assert before["sessions"]["lag_events"] == before["sessions"]["head"] == written.position
    assert before["sessions"]["lag_seconds"] >= 0
    assert not before["sessions"]["running"]

    with ProjectionSupervisor(
        runtime.settings, runtime.db, ["sessions"], sessions=runtime.sessions, poll_interval=0.2
    ):
        assert read.wait_for(written.position, timeout=scaled(5), names=["sessions"])
        now = {s["name"]: s for s in read.status()}
    assert now["sessions"]["lag_events"] == 0 and now["sessions"]["lag_seconds"] == 0.0
    assert now["sessions"]["running"] and "turnlog-projection sessions" in now["sessions"]["holder"]
    assert not now["tool_calls"]["running"]


def test_rebuild_refuses_while_a_runner_holds_the_lock(runtime: Runtime, read: ReadModels) -> None:
    settings: Settings = runtime.settings
    with (
        holding_locks(runtime.db, settings.namespace, read_models("open_turns")),
        pytest.raises(ProjectionBusy, match="open_turns"),
    ):
        rebuild(read.events, runtime.db, settings.namespace, read_models(), wait=0.2)


def _one_batch(read: ReadModels) -> tuple[PostgresReadModelView, Fold]:
    """The sessions view and a fold of every event it has not folded yet (at least one).

    Waits for one: an event is read once the log's commit horizon has passed
    it, which another client's open transaction may delay for a moment.
    """
    model = read_models("sessions")[0]
    view = model.postgres_view(read.events.datastore)
    expected = view.position(read.events.application_name)
    records = poll(
        lambda: read.events.read(expected, 100).records, 30, "an event below the horizon"
    )
    return view, Fold(view, model.projection(view), expected, read.events.decode(records))


@contextmanager
def _in_batch(read: ReadModels, fold: Fold, lock_timeout: float | None = None) -> Iterator[Any]:
    """One view's batch on a connection of its own, its events folded: yields the connection.

    The steps of ``fold_together``; the batch is checked and committed when the ``with`` ends.
    """
    with read.events.datastore.get_connection() as conn, conn.pipeline(), conn.transaction():
        if lock_timeout is not None:
            conn.execute(f"SET LOCAL lock_timeout = '{lock_timeout:.0f}s'")
        fold.view.load(conn, scopes_of(fold))()
        try:
            for event, tracking in fold.events:
                fold.projection.process_event(event, tracking)
            yield conn
            checked = fold.view.finish(conn, fold.events[0][1].application_name, fold.expected)
        finally:
            fold.view.close()
        checked()


def test_a_batch_takes_no_transaction_id_until_its_writes_and_so_holds_no_log_reader_back(
    runtime: Runtime, read: ReadModels
) -> None:
    # A running transaction id holds the log's commit horizon for every reader
    # (application/store/logorder.py); a batch's loads and folding must not.
    runtime.sessions.create_session(title="folded")
    view, fold = _one_batch(read)
    with (
        psycopg.connect(runtime.db.conninfo, autocommit=True) as other,
        _in_batch(read, fold) as conn,
    ):
        found = other.execute(
            "SELECT backend_xid FROM pg_stat_activity WHERE pid = %s", (conn.info.backend_pid,)
        ).fetchone()
        assert found == (None,)
    assert view.position(read.events.application_name) == place_of_tracking(fold.events[-1][1])
    assert [row["title"] for row in read.list_sessions()[0]] == ["folded"]


def test_a_batch_whose_place_moved_after_its_rows_were_loaded_is_refused_and_writes_nothing(
    runtime: Runtime, read: ReadModels
) -> None:
    runtime.sessions.create_session(title="once")
    view, fold = _one_batch(read)
    _, rival = _one_batch(read)
    with (
        pytest.raises(ProjectionConflict, match="another runner advanced it"),
        _in_batch(read, fold),
        # Another runner folds the same events and commits (it ends first)
        # between this batch's load and its claim. Bounded: a batch that
        # claimed first would hold the lock the other one needs.
        _in_batch(read, rival, lock_timeout=scaled(10)),
    ):
        pass
    assert view.position(read.events.application_name) == place_of_tracking(fold.events[-1][1])
    [row] = read.list_sessions()[0]
    assert (row["title"], row["version"]) == ("once", 1)
