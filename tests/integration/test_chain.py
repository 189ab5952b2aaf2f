"""The hash chain: computed at insert, checked by `audit --verify`, old streams chained once."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql

from tests.conftest import turnlog
from tests.histories import scripted_history
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.application.store import chain
from turnlog.interface.bootstrap import build_runtime


def query(settings: Settings, statement: str, *params: Any) -> list[dict[str, Any]]:
    with psycopg.connect(str(settings.database_url), autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(settings.schema_name)))
        cursor = conn.cursor(row_factory=psycopg.rows.dict_row)
        cursor.execute(statement.encode(), params)
        return cursor.fetchall() if cursor.description else []


def links(settings: Settings, session_id: UUID) -> list[chain.Link]:
    rows = query(
        settings,
        "SELECT notification_id, originator_version, topic, state, hash FROM sessions_events"
        " WHERE originator_id = %s ORDER BY originator_version",
        session_id,
    )
    return [
        chain.Link(
            r["notification_id"],
            r["originator_version"],
            r["topic"],
            bytes(r["state"]),
            bytes(r["hash"]) if r["hash"] is not None else None,
        )
        for r in rows
    ]


def test_every_insert_chains_and_verify_names_a_payload_changed_with_its_length_unchanged(
    runtime: Runtime, settings: Settings
) -> None:
    h = scripted_history(runtime)
    sessions = list(h.sessions.values())
    for sid in sessions:
        found = chain.check(links(settings, sid))
        assert not found.broken and not found.unchained
        assert found.chained == len(links(settings, sid)) > 0
    # Saves of several events chained among themselves (one insert each).
    sizes = query(
        settings, "SELECT count(*) AS n FROM sessions_events GROUP BY xact_id ORDER BY n DESC"
    )
    assert sizes[0]["n"] > 1

    sid = h.sessions["done"]
    head = turnlog(settings, "audit", str(sid), "--head")
    assert head.returncode == 0, head.stderr
    stream = links(settings, sid)
    assert head.stdout.split()[0] == stream[-1].hash.hex()  # type: ignore[union-attr]
    assert turnlog(settings, "audit", "--verify", str(sid)).returncode == 0

    # An operator edits a stored payload by hand: same length, still valid JSON.
    target = stream[2]
    text = target.state.decode()
    edited = text
    for old, new in (("true", "TRUE"), ("false", "FALSE"), ("0", "1"), ("1", "2")):
        if old in text:
            edited = text.replace(old, new, 1)
            break
    assert edited != text and len(edited.encode()) == len(target.state)
    json.loads(edited)  # still decodes as JSON
    query(
        settings,
        "UPDATE sessions_events SET state = %s"
        " WHERE originator_id = %s AND originator_version = %s",
        edited.encode(),
        sid,
        target.version,
    )
    verified = turnlog(settings, "audit", "--verify", str(sid))
    assert verified.returncode == 1, verified.stdout
    assert f"chain broken at version {target.version} (position {target.position}" in (
        verified.stdout.replace("\n", " ")
    ), verified.stdout
    # The stored head is unchanged, but it is not offered as one to keep: the chain is broken.
    broken_head = turnlog(settings, "audit", str(sid), "--head")
    assert broken_head.returncode == 1 and broken_head.stdout == "", broken_head.stdout
    assert f"chain broken at version {target.version}" in broken_head.stderr.replace("\n", " ")

    # Removing the hashes from the edit on does not make --chain-existing re-hash it.
    query(
        settings,
        "UPDATE sessions_events SET hash = NULL"
        " WHERE originator_id = %s AND originator_version >= %s",
        sid,
        target.version,
    )
    rehash = turnlog(settings, "audit", "--chain-existing")
    assert rehash.returncode == 1, rehash.stdout + rehash.stderr
    assert f"session {sid}: refused: it has a chain and the chain is broken" in (
        rehash.stderr.replace("\n", " ")
    ), rehash.stderr
    assert str(sid) in rehash.stderr.split("error:")[-1].replace("\n", "")
    assert all(link.hash is None for link in links(settings, sid) if link.version >= target.version)
    still = turnlog(settings, "audit", "--verify", str(sid))
    assert still.returncode == 1, still.stdout


def test_streams_stored_before_the_chain_are_unchained_until_chained_once(
    runtime: Runtime, settings: Settings
) -> None:
    old = runtime.sessions.create_session(title="stored before the chain").session_id
    runtime.close()
    # What older code left: no hash column at all.
    query(settings, "ALTER TABLE sessions_events DROP COLUMN hash")
    states_before = query(settings, "SELECT notification_id, state FROM sessions_events ORDER BY 1")

    rt = build_runtime(settings)  # migrates: the column comes back, NULL for stored rows
    try:
        rt.sessions.create_session(title="chained from the start")
        rt.sessions.close_session(old, "done", "operator:test")  # appended after the migration
    finally:
        rt.close()
    stream = links(settings, old)
    assert all(link.hash is None for link in stream)  # an unchained stream stays so

    unchained = turnlog(settings, "audit", "--verify", str(old))
    assert unchained.returncode == 1, unchained.stdout + unchained.stderr
    assert f"problem: hash chain: {len(stream)} of {len(stream)} events unchained" in (
        unchained.stdout.replace("\n", " ")
    ), unchained.stdout
    accepted = turnlog(settings, "audit", "--verify", "--accept-unchained", str(old))
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert f"not compared: hash chain: {len(stream)} of {len(stream)} events unchained" in (
        accepted.stdout.replace("\n", " ")
    ), accepted.stdout
    strict = ("audit", "--verify", "--accept-unchained", "--strict", str(old))
    assert turnlog(settings, *strict).returncode == 1
    no_head = turnlog(settings, "audit", str(old), "--head")
    assert no_head.returncode == 1 and "unchained" in no_head.stderr

    chained = turnlog(settings, "audit", "--chain-existing")
    assert chained.returncode == 0, chained.stdout + chained.stderr
    assert f"[1/1] session {old}: {len(stream)} event(s) chained" in chained.stderr
    assert f"chained {len(stream)} event(s) in 1 session(s)" in chained.stdout

    found = chain.check(links(settings, old))
    assert found.chained == len(stream) and not found.broken and not found.unchained
    verified = turnlog(settings, "audit", "--verify", str(old))
    assert verified.returncode == 0, verified.stdout
    assert f"compared: hash chain: {len(stream)} of {len(stream)} events" in verified.stdout
    head = turnlog(settings, "audit", str(old), "--head")
    assert head.returncode == 0 and head.stdout.split()[0] == found.head.hex()  # type: ignore[union-attr]
    # Only the hash column was written; a second run finds nothing to do.
    states_after = query(settings, "SELECT notification_id, state FROM sessions_events ORDER BY 1")
    kept = {s["notification_id"] for s in states_before}
    assert [r for r in states_after if r["notification_id"] in kept] == states_before
    again = turnlog(settings, "audit", "--chain-existing")
    assert again.returncode == 0 and "nothing to chain" in again.stdout


def test_a_save_of_one_stream_stores_what_the_general_statement_stores(
    settings: Settings, runtime: Runtime
) -> None:
    """The unrolled insert of one stream's events (the common save) against the recursive one:
    the same rows and hashes, the same refusals (a gap, another epoch)."""
    schema, events = settings.schema_name, "sessions_events"
    saves = [[b"a"], [b"b", b"c"], [b"d", b"e", b"f"], [b"g", b"h", b"i", b"j"], [b"k"]]
    general, stream = UUID(int=1), UUID(int=2)
    with psycopg.connect(str(settings.database_url), autocommit=True) as conn:

        def insert(stream_id: UUID, first: int, states: list[bytes], unrolled: bool) -> int:
            topics = [f"t{first + n}" for n in range(len(states))]
            if unrolled:
                statement = chain.stream_insert_statement(schema, events, len(states))
                params: Any = chain.stream_params(stream_id, first, topics, states, None)
            else:
                statement = chain.insert_statement(schema, events)
                versions = list(range(first, first + len(states)))
                params = ([stream_id] * len(states), versions, topics, states, None, None)
            return len(conn.execute(statement, params).fetchall())

        version = 1
        for states in saves:
            assert insert(general, version, states, unrolled=False) == len(states)
            assert insert(stream, version, states, unrolled=True) == len(states)
            version += len(states)
        assert insert(stream, version + 1, [b"gap"], unrolled=True) == 0
        other_epoch = chain.stream_params(stream, version, ["t"], [b"x"], "2000-01-01T00:00:00Z")
        statement = chain.stream_insert_statement(schema, events, 1)
        assert conn.execute(statement, other_epoch).fetchall() == []

    def stored(stream_id: UUID) -> list[tuple[int, str, bytes, bytes | None]]:
        return [(x.version, x.topic, x.state, x.hash) for x in links(settings, stream_id)]

    assert stored(stream) == stored(general)
    assert len(stored(stream)) == version - 1
    assert not chain.check(links(settings, stream)).broken
