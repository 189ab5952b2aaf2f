"""`turnlog projections rebuild | verify` and `turnlog audit`, run as real commands."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql

from tests.conftest import turnlog
from tests.deadlines import poll
from tests.histories import scripted_history
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.projections import ReadModels, read_models
from turnlog.projections.rebuild import rebuild


def all_rows(read: ReadModels) -> dict[str, list[dict[str, Any]]]:
    snapshots = {}
    for model in read_models():
        _, rows = model.postgres_view(read.events.datastore).snapshot(read.events.application_name)
        snapshots[model.name] = sorted(rows, key=lambda r: str(model.table.key_of(r)))
    return snapshots


def execute(settings: Settings, statement: str, *params: Any) -> int:
    """Run SQL by hand in the namespace's schema (what an operator's mistake looks like)."""
    with psycopg.connect(str(settings.database_url), autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(settings.schema_name)))
        return conn.execute(statement.encode(), params).rowcount


def test_rebuild_reproduces_the_live_rows_and_verify_reports_a_hand_edit(
    runtime: Runtime, settings: Settings
) -> None:
    scripted_history(runtime)
    read = ReadModels(runtime.db, settings, sessions=runtime.sessions)
    rebuild(read.events, runtime.db, settings.namespace, read_models(), batch_size=7)
    live = all_rows(read)

    rebuilt = turnlog(settings, "projections", "rebuild")
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "rebuilt sessions, open_turns, tool_calls" in rebuilt.stdout
    assert all_rows(read) == live
    verified = turnlog(settings, "projections", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "tool_calls: OK (9 rows" in verified.stdout

    assert execute(settings, "UPDATE sessions_view SET status = 'busy' WHERE title = 'done'") == 1
    verified = turnlog(settings, "projections", "verify", "sessions")
    assert verified.returncode == 1
    assert "sessions: 1 difference(s)" in verified.stdout
    assert "column status: live 'busy', expected 'idle'" in verified.stdout


def test_verify_reports_how_far_a_read_model_lags_in_text_and_json(
    runtime: Runtime, settings: Settings
) -> None:
    scripted_history(runtime)
    read = ReadModels(runtime.db, settings, sessions=runtime.sessions)
    rebuild(read.events, runtime.db, settings.namespace, read_models())
    runtime.sessions.create_session(title="after the rebuild")  # no runner folds it

    def lagging() -> dict[str, Any] | None:
        done = turnlog(settings, "projections", "verify", "sessions", "--json")
        assert done.returncode == 0, done.stdout + done.stderr  # a lag is not a difference
        [row] = json.loads(done.stdout)
        return row if row["lag_events"] else None  # once the horizon is past the write

    row = poll(lagging, 30, "the new event below the horizon")
    assert row["ok"] and row["lag_events"] >= 1 and row["head"] > row["position"]
    text = turnlog(settings, "projections", "verify", "sessions")
    assert "event(s) behind the log's head" in text.stdout, text.stdout


def test_audit_verify_passes_on_a_whole_stream_and_names_a_missing_or_corrupt_event(
    runtime: Runtime, settings: Settings
) -> None:
    h = scripted_history(runtime)
    read = ReadModels(runtime.db, settings, sessions=runtime.sessions)
    rebuild(read.events, runtime.db, settings.namespace, read_models())
    done, resolved = h.sessions["done"], h.sessions["resolved"]

    healthy = turnlog(settings, "audit", "--verify", str(done))
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert "OK: session" in healthy.stdout
    listed = turnlog(settings, "audit", "--json", str(resolved))
    lines = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [e["version"] for e in lines] == list(range(1, len(lines) + 1))
    assert lines[0]["topic"] == "turnlog.session.SessionStarted.v1"
    assert all(e["recorded_at"] and e["position"] for e in lines)

    delete_version(settings, done, 3)
    missing = turnlog(settings, "audit", "--verify", str(done))
    assert missing.returncode == 1
    assert "version gap: version(s) 3 missing" in missing.stdout

    assert (
        execute(
            settings,
            "UPDATE sessions_events SET state = convert_to('{not json', 'UTF8')"
            " WHERE originator_id = %s AND originator_version = 2",
            resolved,
        )
        == 1
    )
    corrupt = turnlog(settings, "audit", "--verify", str(resolved))
    assert corrupt.returncode == 1
    assert "event version 2" in corrupt.stdout and "does not decode" in corrupt.stdout


def delete_version(settings: Settings, session_id: UUID, version: int) -> None:
    deleted = execute(
        settings,
        "DELETE FROM sessions_events WHERE originator_id = %s AND originator_version = %s",
        session_id,
        version,
    )
    assert deleted == 1


def test_audit_pages_the_whole_log_and_refuses_an_unknown_session(
    runtime: Runtime, settings: Settings
) -> None:
    for title in ("a", "b", "c"):
        runtime.sessions.create_session(title=title)

    def second() -> list[int]:  # once the commit horizon is past it (another client may hold it)
        page = turnlog(settings, "audit", "--log", "--after", "1", "--limit", "1", "--json")
        assert page.returncode == 0, page.stderr
        return [json.loads(line)["position"] for line in page.stdout.splitlines()]

    assert poll(second, 30, "the second event in the log") == [2]
    unknown = turnlog(settings, "audit", "--verify", "00000000-0000-0000-0000-000000000001")
    assert unknown.returncode == 4 and "session_not_found" in unknown.stderr


def test_audit_verify_says_what_it_could_not_compare_and_strict_fails_on_it(
    runtime: Runtime, settings: Settings
) -> None:
    h = scripted_history(runtime)
    done = h.sessions["done"]  # no runner ever ran: every read model is at position 0

    lenient = turnlog(settings, "audit", "--verify", str(done))
    assert lenient.returncode == 0, lenient.stdout + lenient.stderr
    assert "every read model agrees" not in lenient.stdout
    assert "3 comparison(s) could not be made" in lenient.stdout
    for name in ("sessions", "open_turns", "tool_calls"):
        assert f"not compared: read model {name}: at position 0" in lenient.stdout
    strict = turnlog(settings, "audit", "--verify", "--strict", str(done))
    assert strict.returncode == 1, strict.stdout

    read = ReadModels(runtime.db, settings, sessions=runtime.sessions)
    rebuild(read.events, runtime.db, settings.namespace, read_models())
    whole = turnlog(settings, "audit", "--verify", "--strict", str(done))
    assert whole.returncode == 0, whole.stdout + whole.stderr
    assert "every read model agrees" in whole.stdout and "not compared" not in whole.stdout
    assert "compared: read model open_turns: rows match all" in whole.stdout


def test_rebuild_waits_for_events_an_older_open_transaction_holds_back(
    runtime: Runtime, settings: Settings
) -> None:
    # Any client of the server can hold the commit horizon back; events committed after
    # its transaction began cannot be read in log order until it ends. A rebuild that
    # began after them must wait for them, not stop short and call itself done.
    read = ReadModels(runtime.db, settings, sessions=runtime.sessions)
    with psycopg.connect(str(settings.database_url)) as holder:
        holder.execute("SELECT pg_current_xact_id()")  # a transaction id: holds the horizon
        session_id = runtime.sessions.create_session(title="behind the horizon").session_id
        waited: list[dict[str, Any]] = []

        def held(who: dict[str, Any]) -> None:
            waited.append(who)
            if len(waited) == 3:
                holder.rollback()  # the transaction ends: what it held back is readable

        done = rebuild(
            read.events, runtime.db, settings.namespace, read_models(), held=held, held_notice=0
        )
    assert len(waited) >= 3 and waited[0]["pid"] is not None
    assert done.held_back == 0 and done.position == read.events.head()
    titles = [r["title"] for r in all_rows(read)["sessions"] if r["session_id"] == session_id]
    assert titles == ["behind the horizon"]


def test_a_rebuild_whose_horizon_wait_runs_out_says_what_is_left_and_by_whom(
    runtime: Runtime, settings: Settings
) -> None:
    with psycopg.connect(str(settings.database_url)) as holder:
        holder.execute("SELECT pg_current_xact_id()")
        runtime.sessions.create_session(title="behind the horizon")
        rebuilt = turnlog(settings, "projections", "rebuild", "--horizon-wait", "0.3")
        holder.rollback()
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "waiting for events held back: commit horizon: held by server pid" in rebuilt.stderr
    assert "not at the head: 1 event(s) committed before the rebuild" in rebuilt.stderr
