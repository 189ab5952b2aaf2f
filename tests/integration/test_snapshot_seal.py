"""Sealed snapshots: an edited snapshot is never loaded, and `audit --verify` names it."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from typing import Any
from uuid import UUID

import pytest

from tests.conftest import turnlog
from tests.integration.test_chain import query
from tests.integration.test_long_sessions import _insert_fixture
from turnlog.application.sessions import Sessions
from turnlog.application.settings import Settings
from turnlog.application.store import seal
from turnlog.application.store.database import library_env, locate
from turnlog.domain.session import Session
from turnlog.interface.bootstrap import build_runtime

Edit = Callable[[dict[str, Any]], None]


def _open_policy(state: dict[str, Any]) -> None:
    state["approval_policy"] = "none"


def _drop_pending_call(state: dict[str, Any]) -> None:
    state["calls"] = {}


def _change_counter(state: dict[str, Any]) -> None:
    state["turns"][0]["_data_"]["claim"] += 1


EDITS = {"policy": _open_policy, "pending call": _drop_pending_call, "counter": _change_counter}


@pytest.fixture
def awaiting(settings: Settings) -> Iterator[tuple[Settings, UUID, int]]:
    """A session whose turn awaits an operator's approval, snapshotted at its last version."""
    rt = build_runtime(settings)
    try:
        sid = rt.sessions.create_session(tools=["append_file"], approval_policy="all").session_id
        args = json.dumps({"path": "out.txt", "text": "x"})
        assert rt.send(sid, f"/tool append_file {args}").turn.state == "awaiting_approval"
        rt.sessions.take_snapshot(sid)
        version = rt.sessions.get_session(sid).version
    finally:
        rt.close()
    yield settings, sid, version


def snapshot_row(settings: Settings, sid: UUID, version: int) -> dict[str, Any]:
    rows = query(
        settings,
        "SELECT * FROM sessions_snapshots WHERE originator_id = %s AND originator_version = %s",
        sid,
        version,
    )
    assert len(rows) == 1
    return rows[0]


def edit_state(settings: Settings, sid: UUID, version: int, edit: Edit) -> bytes:
    """Change the snapshot's aggregate state in SQL, as an operator might by hand."""
    stored = json.loads(bytes(snapshot_row(settings, sid, version)["state"]))
    edit(stored["state"])
    state = json.dumps(stored, separators=(",", ":")).encode()
    query(
        settings,
        "UPDATE sessions_snapshots SET state = %s"
        " WHERE originator_id = %s AND originator_version = %s",
        state,
        sid,
        version,
    )
    return state


def fresh_load(settings: Settings, sid: UUID) -> Session:
    """The session as the next process loads it (a new application: no cache)."""
    rt = build_runtime(settings)
    try:
        return rt.sessions.get_session(sid)
    finally:
        rt.close()


def replayed(settings: Settings, sid: UUID) -> Session:
    """The session replayed from its events alone (snapshots off)."""
    env = library_env(locate(settings), settings, create_table=False)
    events_only = Sessions(env={**env, "IS_SNAPSHOTTING_ENABLED": "n"}, snapshot_interval=10_000)
    try:
        session = events_only.repository.get(sid)
        assert isinstance(session, Session)
        return session
    finally:
        events_only.close()


def verify(settings: Settings, sid: UUID) -> tuple[int, str]:
    done = turnlog(settings, "audit", "--verify", str(sid))
    return done.returncode, (done.stdout + done.stderr).replace("\n", " ")


def ignored_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "turnlog.snapshots"]


def test_a_fresh_snapshot_is_sealed_and_verifies(awaiting: tuple[Settings, UUID, int]) -> None:
    settings, sid, version = awaiting
    row = snapshot_row(settings, sid, version)
    event = query(
        settings,
        "SELECT hash FROM sessions_events WHERE originator_id = %s AND originator_version = %s",
        sid,
        version,
    )[0]
    assert bytes(row["chain_head"]) == bytes(event["hash"])
    # The insert's digest (computed in SQL) is the one the loader recomputes.
    assert bytes(row["digest"]) == seal.digest(
        bytes(event["hash"]), version, row["topic"], bytes(row["state"])
    )
    code, out = verify(settings, sid)
    assert code == 0, out
    assert f"compared: snapshot of session {sid} at version {version} (sealed) equals" in out


@pytest.mark.parametrize("what", sorted(EDITS))
def test_a_snapshot_state_edited_by_hand_is_ignored_and_named(
    awaiting: tuple[Settings, UUID, int], what: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings, sid, version = awaiting
    edited = edit_state(settings, sid, version, EDITS[what])
    caplog.set_level(logging.WARNING, logger="turnlog.snapshots")

    loaded = fresh_load(settings, sid)

    assert loaded.__dict__ == replayed(settings, sid).__dict__
    assert loaded.approval_policy == "all" and loaded.calls  # what the runtime allows is kept
    warned = ignored_warnings(caplog)
    assert warned and f"session {sid} at version {version} ignored" in warned[0].getMessage()
    assert b"out.txt" in edited and "out.txt" not in warned[0].getMessage()  # no state logged
    code, out = verify(settings, sid)
    assert code == 1, out
    assert f"problem: snapshot of session {sid} at version {version}: its seal does not hold" in out
    assert f"snapshot of session {sid} at version {version} differs from the replay" in out


def test_an_edited_seal_is_ignored_and_named(
    awaiting: tuple[Settings, UUID, int], caplog: pytest.LogCaptureFixture
) -> None:
    settings, sid, version = awaiting
    for column in ("digest", "chain_head"):
        query(
            settings,
            f"UPDATE sessions_snapshots SET {column} = sha256('edited')"
            " WHERE originator_id = %s AND originator_version = %s",
            sid,
            version,
        )
        caplog.clear()
        caplog.set_level(logging.WARNING, logger="turnlog.snapshots")
        assert fresh_load(settings, sid).__dict__ == replayed(settings, sid).__dict__
        assert ignored_warnings(caplog), column
        code, out = verify(settings, sid)
        assert code == 1, out
        assert f"snapshot of session {sid} at version {version}: its seal does not hold" in out


def test_a_state_edited_with_its_digest_recomputed_is_named_by_the_replay(
    awaiting: tuple[Settings, UUID, int],
) -> None:
    settings, sid, version = awaiting
    row = snapshot_row(settings, sid, version)
    state = edit_state(settings, sid, version, _open_policy)
    forged = seal.digest(bytes(row["chain_head"]), version, row["topic"], state)
    query(
        settings,
        "UPDATE sessions_snapshots SET digest = %s"
        " WHERE originator_id = %s AND originator_version = %s",
        forged,
        sid,
        version,
    )
    code, out = verify(settings, sid)
    assert code == 1, out
    assert "its seal does not hold" not in out  # the seal was forged: only the replay tells
    assert (
        f"problem: snapshot of session {sid} at version {version} differs from the replay"
        f" of events 1..{version} in approval_policy" in out
    )


def test_an_unsealed_snapshot_keeps_loading_and_is_reported_unsealed(
    awaiting: tuple[Settings, UUID, int], caplog: pytest.LogCaptureFixture
) -> None:
    settings, sid, version = awaiting
    # What earlier versions stored: no seal.
    query(
        settings,
        "UPDATE sessions_snapshots SET chain_head = NULL, digest = NULL WHERE originator_id = %s",
        sid,
    )
    caplog.set_level(logging.WARNING, logger="turnlog.snapshots")
    assert fresh_load(settings, sid).__dict__ == replayed(settings, sid).__dict__
    assert not ignored_warnings(caplog)
    code, out = verify(settings, sid)
    assert code == 0, out
    assert f"note: snapshot of session {sid} at version {version} is unsealed" in out
    assert f"at version {version} (unsealed) equals the replay of events 1..{version}" in out

    # Edited while unsealed: still loaded (nothing proves it), but the audit names it.
    edit_state(settings, sid, version, _open_policy)
    code, out = verify(settings, sid)
    assert code == 1, out
    assert f"at version {version} differs from the replay of events 1..{version}" in out


def test_version_1_snapshots_of_earlier_code_load_and_verify_as_unsealed(
    settings: Settings, database: object
) -> None:
    rt = build_runtime(settings)
    try:
        sid, data = _insert_fixture(database, settings.schema_name)
        assert rt.sessions.get_session(sid).version == len(data["sessions_events"])
    finally:
        rt.close()
    code, out = verify(settings, sid)
    assert "differs from the replay" not in out and "does not decode" not in out, out
    versions = [v for v, _, _ in data["sessions_snapshots"]]
    for version in versions:
        assert f"snapshot of session {sid} at version {version} is unsealed" in out, out
        assert f"at version {version} (unsealed) equals the replay" in out, out
    assert code == 1 and "events unchained" in out  # the fixture's stream predates the chain


def test_a_snapshot_of_an_unchained_stream_names_no_head_and_keeps_loading(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    rt = build_runtime(settings)
    try:
        sid = rt.sessions.create_session(title="unchained").session_id
        # As a stream stored before the chain: its events have no hash, nor do later ones.
        query(settings, "UPDATE sessions_events SET hash = NULL WHERE originator_id = %s", sid)
        rt.send(sid, "hello")
        rt.sessions.take_snapshot(sid)
        version = rt.sessions.get_session(sid).version
    finally:
        rt.close()
    assert snapshot_row(settings, sid, version)["chain_head"] is None
    caplog.set_level(logging.WARNING, logger="turnlog.snapshots")
    assert fresh_load(settings, sid).__dict__ == replayed(settings, sid).__dict__
    done = turnlog(settings, "audit", "--verify", "--accept-unchained", str(sid))
    assert done.returncode == 0, done.stdout
    assert f"at version {version} (sealed) equals" in done.stdout.replace("\n", " ")
    # Chained later: the snapshot (sealed before) is still used, still verifies.
    assert turnlog(settings, "audit", "--chain-existing").returncode == 0
    assert fresh_load(settings, sid).__dict__ == replayed(settings, sid).__dict__
    assert not ignored_warnings(caplog)
    code, out = verify(settings, sid)
    assert code == 0, out


def test_a_snapshots_table_of_earlier_code_gets_the_seal_columns_only_from_an_owner(
    awaiting: tuple[Settings, UUID, int],
) -> None:
    settings, sid, version = awaiting
    before = bytes(snapshot_row(settings, sid, version)["state"])
    # What earlier versions left: no seal columns at all.
    query(settings, "ALTER TABLE sessions_snapshots DROP COLUMN chain_head, DROP COLUMN digest")
    listing = turnlog(settings, "sessions", "list")
    assert listing.returncode == 5, listing.stdout + listing.stderr  # a one-shot never migrates
    assert "turnlog db init" in listing.stderr.replace("\n", " "), listing.stderr

    init = turnlog(settings, "db", "init")
    assert init.returncode == 0, init.stdout + init.stderr
    row = snapshot_row(settings, sid, version)
    assert row["chain_head"] is None and row["digest"] is None  # stored rows not rewritten
    assert bytes(row["state"]) == before
    assert fresh_load(settings, sid).__dict__ == replayed(settings, sid).__dict__
    code, out = verify(settings, sid)
    assert code == 0, out
    assert f"snapshot of session {sid} at version {version} is unsealed" in out
