"""A snapshot keeps its older finished-turn entries in chunks, so its size stays bounded.

The next process loads the session whole (equal to a replay of its events),
`audit --verify` agrees, a changed chunk makes its snapshots ignored, and a
purge deletes the chunks with the session's other rows.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest

from tests.conftest import turnlog
from tests.integration.test_chain import query
from tests.integration.test_snapshot_seal import fresh_load, replayed, verify
from turnlog.application.settings import Settings
from turnlog.application.store import finished_chunks
from turnlog.interface.bootstrap import build_runtime

TURNS = 150


@pytest.fixture
def long_session(settings: Settings) -> Iterator[tuple[Settings, UUID]]:
    """A session of TURNS finished turns, snapshotted every 50 events as it ran."""
    rt = build_runtime(settings)
    try:
        sid = rt.sessions.create_session().session_id
        for n in range(TURNS):
            assert rt.send(sid, f"message {n}").turn.state == "completed"
    finally:
        rt.close()
    yield settings, sid


def chunks(settings: Settings, sid: UUID) -> list[dict[str, Any]]:
    return query(
        settings,
        "SELECT first_n, last_n, entries FROM sessions_finished_chunks"
        " WHERE session_id = %s ORDER BY first_n",
        sid,
    )


def latest_snapshot_state(settings: Settings, sid: UUID) -> dict[str, Any]:
    row = query(
        settings,
        "SELECT state FROM sessions_snapshots WHERE originator_id = %s"
        " ORDER BY originator_version DESC LIMIT 1",
        sid,
    )[0]
    state: dict[str, Any] = json.loads(bytes(row["state"]))["state"]
    return state


def test_older_entries_are_stored_once_in_chunks_and_the_session_loads_whole(
    long_session: tuple[Settings, UUID],
) -> None:
    settings, sid = long_session
    rows = chunks(settings, sid)
    assert rows and rows[0]["first_n"] == 0
    assert all(a["last_n"] == b["first_n"] for a, b in itertools.pairwise(rows))
    assert all(r["last_n"] - r["first_n"] >= finished_chunks.CHUNK for r in rows)

    state = latest_snapshot_state(settings, sid)
    mark = state[finished_chunks.MARK]
    assert mark["count"] == rows[-1]["last_n"]
    assert len(state["finished"]) < 2 * finished_chunks.CHUNK  # only the newest inline

    loaded = fresh_load(settings, sid)
    assert len(loaded.finished) == TURNS
    assert loaded.__dict__ == replayed(settings, sid).__dict__
    code, out = verify(settings, sid)
    assert code == 0, out


def test_a_changed_chunk_makes_its_snapshots_ignored(
    long_session: tuple[Settings, UUID], caplog: pytest.LogCaptureFixture
) -> None:
    settings, sid = long_session
    first = chunks(settings, sid)[0]
    entries = json.loads(bytes(first["entries"]))
    entries[0][1] = "failed"  # the first turn completed; say it failed
    query(
        settings,
        "UPDATE sessions_finished_chunks SET entries = %s WHERE session_id = %s AND first_n = 0",
        json.dumps(entries, separators=(",", ":")).encode(),
        sid,
    )

    with caplog.at_level(logging.WARNING, logger="turnlog.snapshots"):
        loaded = fresh_load(settings, sid)
    assert loaded.__dict__ == replayed(settings, sid).__dict__
    assert str(loaded.finished_turns()[0].state) == "completed"
    assert any("chunks of finished turns" in r.getMessage() for r in caplog.records)
    code, out = verify(settings, sid)
    assert code != 0, out


def test_a_purge_deletes_the_chunks_with_the_session(
    long_session: tuple[Settings, UUID],
) -> None:
    settings, sid = long_session
    assert chunks(settings, sid)
    done = turnlog(settings, "sessions", "purge", str(sid), "--reason", "test", "--actor", "ops")
    assert done.returncode == 0, done.stdout + done.stderr
    assert chunks(settings, sid) == []


def test_a_namespace_of_earlier_code_gets_the_chunks_table_only_from_an_owner(
    settings: Settings,
) -> None:
    rt = build_runtime(settings)
    try:
        sid = rt.sessions.create_session().session_id
        rt.sessions.take_snapshot(sid)
    finally:
        rt.close()
    query(settings, "DROP TABLE sessions_finished_chunks")  # as earlier code left it
    listing = turnlog(settings, "sessions", "list")
    assert listing.returncode == 5, listing.stdout + listing.stderr  # a one-shot never migrates
    assert "turnlog db init" in listing.stderr.replace("\n", " "), listing.stderr

    init = turnlog(settings, "db", "init")
    assert init.returncode == 0, init.stdout + init.stderr
    assert chunks(settings, sid) == []  # the table is back, empty
    assert fresh_load(settings, sid).__dict__ == replayed(settings, sid).__dict__


def test_joining_the_stored_bytes_gives_what_decoding_every_chunk_gives(
    long_session: tuple[Settings, UUID],
) -> None:
    settings, sid = long_session
    rows = chunks(settings, sid)
    snapshot = query(
        settings,
        "SELECT state FROM sessions_snapshots WHERE originator_id = %s"
        " ORDER BY originator_version DESC LIMIT 1",
        sid,
    )[0]
    results = []
    for join in (finished_chunks._joined, finished_chunks._decoded_and_joined):
        obj = json.loads(bytes(snapshot["state"]))
        state = obj["state"]
        mark = state.pop(finished_chunks.MARK)
        whole = join(obj, state, mark, rows)
        assert whole is not None
        results.append(json.loads(whole))
    assert results[0] == results[1]
    assert len(results[0]["state"]["finished"]) == TURNS


def test_a_chunk_spelled_otherwise_is_decoded_and_still_serves(
    long_session: tuple[Settings, UUID], caplog: pytest.LogCaptureFixture
) -> None:
    settings, sid = long_session
    first = chunks(settings, sid)[0]
    spaced = json.dumps(json.loads(bytes(first["entries"]))).encode()  # same entries
    assert spaced != bytes(first["entries"])
    query(
        settings,
        "UPDATE sessions_finished_chunks SET entries = %s WHERE session_id = %s AND first_n = 0",
        spaced,
        sid,
    )
    with caplog.at_level(logging.WARNING, logger="turnlog.snapshots"):
        loaded = fresh_load(settings, sid)
    assert loaded.__dict__ == replayed(settings, sid).__dict__
    assert not any("chunks of finished turns" in r.getMessage() for r in caplog.records)
