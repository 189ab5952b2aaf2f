"""Hostile input against a live server: refused with a clear 4xx, never a 5xx, never a write.

Oversize and streamed bodies, deep JSON, invalid UTF-8 and lone surrogates,
huge headers and query strings, SQL metacharacters and NUL in every string
field, path traversal in tool paths and ids, namespaces that are not
identifiers — and the values that once broke the record for good: a NUL in
a title stopped a read model, a lone surrogate or deep nesting in a model's
reply made the worker re-claim the turn in a loop.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import psycopg
import pytest
from psycopg import sql

from tests.api.conftest import APPEND, CATCHING_UP, live_server
from tests.conftest import ROOT, raw_events, turnlog
from tests.deadlines import scaled
from tests.fault.cluster import poll
from turnlog.application.errors import LeaseLost
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database
from turnlog.domain.turns import Effect
from turnlog.interface.http import create_app

SQL_TEXT = [
    "'; DROP TABLE sessions_events; --",
    '" OR 1=1 --',
    "\\'; SELECT pg_sleep(5); --",
    "%_%",
    "$1 $$ $tag$ ::text",
    "a\x00b",
    "Robert'); DELETE FROM turnlog_x.workers;--",
]


@pytest.fixture
def url(settings: Settings, runtime: Runtime) -> Iterator[str]:
    app = create_app(settings, role="all", options=CATCHING_UP, worker_concurrency=2)
    with live_server(app) as base:
        yield base


def interrupted(url: str, runtime: Runtime, session_id: str) -> tuple[str, str]:
    """An interrupted turn, as a worker dying inside append_file leaves it: (turn, call).

    The server's own worker runs here too, so the steps are recorded while
    this test holds the session's lease; whoever takes it next interrupts.
    """
    sid, sessions, dead = UUID(session_id), runtime.sessions, "gone:1:dead"
    # The worker lets go of the session a moment after its last turn finished.
    lease = poll(lambda: runtime.leases.try_acquire(sid), 10, "the lease")
    with lease:
        turn_id = sessions.submit_turn(sid, "/tool append_file {}").turn_id
        call_id = f"call_{turn_id[:8]}"
        claim, _ = sessions.update(sid, lambda s: s.claim_turn(turn_id, dead))
        call = {"call_id": call_id, "name": "append_file", "arguments": APPEND}
        sessions.update(sid, lambda s: s.record_model_reply(turn_id, claim, "", [call]))
        sessions.update(
            sid, lambda s: s.start_tool_call(turn_id, claim, call_id, dead, Effect.SIDE_EFFECTING)
        )
    with contextlib.suppress(LeaseLost):
        runtime.continue_session(sid)
    path = f"{url}/v1/sessions/{session_id}/turns/{turn_id}"
    poll(lambda: httpx.get(path).json()["state"] == "interrupted", 20, "interrupted")
    return turn_id, call_id


def head(database: Database, settings: Settings) -> tuple[int, int]:
    """(events, last position) of the namespace's log."""
    rows = raw_events(database, settings.namespace)
    return len(rows), (rows[-1][0] if rows else 0)


def post(url: str, path: str, body: Any = None, **kwargs: Any) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=30, **kwargs)


def session(url: str, **body: Any) -> str:
    created = post(url, "/v1/sessions", body)
    assert created.status_code == 201, created.text
    return str(created.json()["session_id"])


def problem_status(response: httpx.Response) -> int:
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert response.headers["content-type"].startswith("application/problem+json")
    return response.status_code


def test_invalid_requests_answer_4xx_and_leave_the_log_as_it_was(
    url: str, settings: Settings, database: Database
) -> None:
    sid = session(url)
    turns = f"/v1/sessions/{sid}/turns"
    before = head(database, settings)
    raw = {"content-type": "application/json"}
    answers = {
        "declared oversize": httpx.post(url + turns, content=b"x" * (2 << 20), headers=raw),
        "streamed oversize": httpx.post(
            url + turns, content=iter([b'{"message": "', b"x" * (2 << 20), b'"}']), headers=raw
        ),
        "deep arrays": httpx.post(
            url + turns, content=b'{"message": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", headers=raw
        ),
        "deep metadata": post(url, "/v1/sessions", {"metadata": _nested(200)}),
        # JSON true is not the number 1, nor "5" a count: no field coerces them.
        "a boolean as a count": post(url, "/v1/sessions", {"context": {"max_turns": True}}),
        "a string as a count": post(url, "/v1/sessions", {"context": {"max_chars": "5000"}}),
        "a boolean as seconds": post(url, turns, {"message": "m", "deadline_seconds": True}),
        "nested just past the limit": post(url, "/v1/sessions", {"metadata": _nested(65)}),
        "invalid UTF-8": httpx.post(
            url + turns, content=b'{"message": "\xff\xfe\xc3("}', headers=raw
        ),
        "lone surrogate": httpx.post(url + turns, content=b'{"message": "\\ud800"}', headers=raw),
        "surrogate in a title": httpx.post(
            url + "/v1/sessions", content=b'{"title": "\\udfff"}', headers=raw
        ),
        "surrogate in a result": post(
            url,
            f"/v1/sessions/{sid}/tool-calls/call_x/resolve",
            None,
            content=b'{"outcome": "succeeded", "result": "\\ud800", "note": "n", "actor": "a"}',
            headers=raw,
        ),
        "not JSON": httpx.post(url + turns, content=b"{'message': 1", headers=raw),
        "huge idempotency key": post(
            url, turns, {"message": "x"}, headers={"Idempotency-Key": "k" * 5000}
        ),
        "huge query": httpx.get(url + "/v1/sessions", params={"cursor": "c" * 60_000}),
        "unknown query": httpx.get(url + "/v1/sessions", params={"statu": "idle"}),
        "NUL in a filter": httpx.get(url + "/v1/tool-calls", params={"tool": "a\x00b"}),
        "NUL in a cursor": httpx.get(url + "/v1/tool-calls", params={"cursor": _cursor("a\x00")}),
        "huge position in a cursor": httpx.get(
            url + "/v1/sessions", params={"cursor": _cursor(10**30, kind="sessions")}
        ),
        "SQL in a status": httpx.get(url + "/v1/sessions", params={"status": SQL_TEXT[0]}),
        "SQL in a session filter": httpx.get(
            url + "/v1/tool-calls", params={"session_id": SQL_TEXT[1]}
        ),
        "traversal in an id": httpx.get(url + "/v1/sessions/..%2F..%2F..%2Fetc%2Fpasswd"),
        "traversal in a turn id": httpx.get(f"{url}{turns}/..%2F..%2Fsandboxes"),
        "SQL in a turn id": post(
            url, f"{turns}/{SQL_TEXT[0]}/abandon", {"reason": "r", "actor": "a"}
        ),
        "SQL in a call id": post(
            url,
            f"/v1/sessions/{sid}/tool-calls/{SQL_TEXT[4]}/resolve",
            {"outcome": "succeeded", "result": 1, "note": "n", "actor": "a"},
        ),
        "unknown tool": post(url, "/v1/sessions", {"tools": ["../../bin/sh"]}),
        "reserved metadata": post(url, "/v1/sessions", {"metadata": {"turnlog.idempotency": 1}}),
        "wrong types": post(url, "/v1/sessions", {"title": ["x"], "tools": "echo"}),
        "extra fields": post(url, turns, {"message": "x", "role": "system"}),
        "empty message": post(url, turns, {"message": " \t\n"}),
        "message too long": post(url, turns, {"message": "x" * (64 * 1024 + 1)}),
        "Last-Event-ID not a number": httpx.get(
            f"{url}/v1/sessions/{sid}/events",
            headers={"accept": "text/event-stream", "last-event-id": SQL_TEXT[0]},
        ),
    }
    statuses = {name: problem_status(r) for name, r in answers.items()}
    refused = {name: s for name, s in statuses.items() if not 400 <= s < 500}
    assert not refused, refused
    assert statuses["declared oversize"] == statuses["streamed oversize"] == 413
    assert head(database, settings) == before  # nothing written by any of them
    assert httpx.get(f"{url}/readyz", timeout=10).status_code == 200


@pytest.mark.parametrize(
    "headers",
    [{"X-Big": "a" * 200_000}, {f"X-{i}": "a" for i in range(3000)}, {"X-Request-ID": "../" * 50}],
    ids=["one huge header", "3000 headers", "a hostile request id"],
)
def test_huge_headers_are_refused_or_ignored_and_the_server_stays_up(
    url: str, headers: dict[str, str]
) -> None:
    try:
        response = httpx.get(url + "/v1/sessions", headers=headers, timeout=30)
    except httpx.TransportError:
        pass  # the HTTP parser closed the connection: refused before any of our code ran
    else:
        assert response.status_code < 500, response.text
        assert "../" not in response.headers.get("x-request-id", "")
    assert httpx.get(f"{url}/readyz", timeout=10).status_code == 200


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def _cursor(value: Any, kind: str = "tool_calls") -> str:
    import base64

    items = [kind, value] if kind == "sessions" else [kind, 1, value]
    return base64.urlsafe_b64encode(json.dumps(items).encode()).decode().rstrip("=")


def test_sql_metacharacters_and_nul_in_every_string_field_are_stored_as_plain_text(
    url: str, settings: Settings, database: Database, runtime: Runtime
) -> None:
    for text in SQL_TEXT:
        body = {
            "title": text,
            "system_prompt": text,
            "model": text,
            "created_by": text,
            "metadata": {text: text, "nested": [text, {text: text}]},
        }
        sid = session(url, **body)
        shown = httpx.get(f"{url}/v1/sessions/{sid}", timeout=30).json()
        assert [shown[k] for k in ("title", "model", "created_by")] == [text] * 3
        assert shown["metadata"] == body["metadata"]
        done = post(url, f"/v1/sessions/{sid}/turns?wait=30", {"message": text})
        assert done.status_code == 200 and done.json()["reply"] == f"Echo: {text}", done.text
        # An operator's words and a result carry the same text into the record.
        _, call_id = interrupted(url, runtime, sid)
        resolved = post(
            url,
            f"/v1/sessions/{sid}/tool-calls/{call_id}/resolve",
            {"outcome": "succeeded", "result": text, "note": text, "actor": text},
        )
        assert resolved.status_code == 200, resolved.text
    _read_models_whole(url, settings, database)


def test_a_nul_in_a_title_a_tool_name_or_a_result_never_stops_a_read_model(
    url: str, settings: Settings, database: Database, runtime: Runtime
) -> None:
    """Each once failed its read model's batch forever (PostgreSQL text holds no NUL).

    (A tool name or call id with NUL, from a model, takes the same path: tests/unit/test_values.py.)
    """
    sid = session(url, title="before\x00after", created_by="ops\x00")
    echoed = post(
        url, f"/v1/sessions/{sid}/turns?wait=30", {"message": '/tool echo {"t": "\\u0000"}'}
    )
    assert echoed.json()["state"] == "completed"
    _, call_id = interrupted(url, runtime, sid)
    post(
        url,
        f"/v1/sessions/{sid}/tool-calls/{call_id}/resolve",
        {"outcome": "failed", "result": "x\x00y", "note": "n\x00", "actor": "a"},
    )
    later = session(url, title="later")
    listed = httpx.get(f"{url}/v1/sessions", params={"min_position": _last(database, settings)})
    assert listed.status_code == 200, listed.text
    titles = {row["session_id"]: row["title"] for row in listed.json()["items"]}
    assert titles[sid] == "before\ufffdafter" and later in titles
    _read_models_whole(url, settings, database)


def _last(database: Database, settings: Settings) -> int:
    return head(database, settings)[1]


def _read_models_whole(url: str, settings: Settings, database: Database) -> None:
    """Every read model caught up with the log, and `projections verify` agrees with it."""
    position = _last(database, settings)
    for path in ("/v1/sessions", "/v1/open-turns", "/v1/tool-calls"):
        caught_up = httpx.get(url + path, params={"min_position": position}, timeout=30)
        assert caught_up.status_code == 200, caught_up.text
    projections = httpx.get(f"{url}/v1/projections", timeout=30).json()["items"]
    assert all(p["running"] and p["position"] >= position for p in projections), projections
    verified = turnlog(settings, "projections", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr


@pytest.mark.parametrize(
    "arguments",
    [
        '{"text": "\\ud800"}',
        "{" + '"a": {' * 100 + "}" * 100 + "}",
        '{"text": NaN}',
        '{"n": [1, -Infinity]}',
        '{"n": 1e400}',
    ],
    ids=["lone surrogate", "nested 100 deep", "NaN", "-Infinity", "1e400"],
)
def test_a_model_reply_the_record_cannot_hold_fails_the_turn_once(
    url: str, settings: Settings, database: Database, arguments: str
) -> None:
    """It used to crash the worker on every attempt: a claim event per retry, without end."""
    sid = session(url)
    done = post(url, f"/v1/sessions/{sid}/turns?wait=30", {"message": f"/tool echo {arguments}"})
    assert done.status_code == 200, done.text
    assert done.json()["state"] == "failed"
    assert done.json()["error"].startswith("invalid model reply")
    assert [r[3].split(".")[2] for r in raw_events(database, settings.namespace, sid)] == [
        "SessionStarted",
        "TurnSubmitted",
        "TurnClaimed",
        "TurnFailed",
    ]
    again = post(url, f"/v1/sessions/{sid}/turns?wait=30", {"message": "still here"})
    assert again.json()["reply"] == "Echo: still here"


ESCAPES = [
    "../outside.txt",
    "../../../../tmp/turnlog-escape.txt",
    "/tmp/turnlog-abs.txt",
    "a/../../b.txt",
    "a\x00b.txt",
    ".",
    "",
    "sub/./../../c.txt",
    "..",
]


def test_append_file_paths_that_leave_the_sandbox_fail_the_call_and_write_nothing(
    url: str, settings: Settings
) -> None:
    sid = session(url)
    for path in ESCAPES:
        body = {"path": path, "text": "escaped"}
        done = post(
            url,
            f"/v1/sessions/{sid}/turns?wait=30",
            {"message": f"/tool append_file {json.dumps(body)}"},
        )
        call = done.json()["tool_calls"][0]
        assert call["state"] == "failed", (path, call)
    written = [p for p in Path(settings.data_dir).rglob("*") if p.is_file()]
    assert written == [], written
    assert not Path("/tmp/turnlog-escape.txt").exists()
    assert not Path("/tmp/turnlog-abs.txt").exists()
    # Sandboxes are named by session ids, which are UUIDs: a path can never choose one.
    assert [p.name for p in settings.sandbox_root.iterdir()] == [sid]


@pytest.mark.parametrize(
    "name",
    [
        "",
        "Default",
        "1abc",
        "a-b",
        "a b",
        "a;drop schema public",
        "a" * 41,
        "ä",
        "a\x00",
        "../x",
        "turnlog_x'--",
    ],
)
def test_namespaces_that_are_not_identifiers_are_refused_before_any_sql(
    name: str, database: Database, settings: Settings
) -> None:
    with pytest.raises(ValueError, match="invalid namespace"):
        Settings(namespace=name)
    if name not in ("a-b", "a;drop schema public", "../x"):
        return  # the same refusal; a process started for three of them is enough
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNLOG_")}
    env.update(
        TURNLOG_DATABASE_URL=settings.database_url or "",
        TURNLOG_NAMESPACE=name,
        TURNLOG_DATA_DIR=str(settings.data_dir),
    )
    before = _schemas(database)
    done = subprocess.run(
        [sys.executable, "-m", "turnlog", "db", "init"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "invalid namespace" in done.stderr + done.stdout
    after = _schemas(database)
    # Other tests of this run create and drop their own namespaces meanwhile (and temporary
    # schemas come and go with connections): only those may differ.
    assert {s for s in set(after) ^ set(before) if not _of_another_test(s)} == set()


def _of_another_test(schema: str) -> bool:
    return re.fullmatch(r"turnlog_t_\w+|pg_(toast_)?temp_\d+", schema) is not None


def _schemas(database: Database) -> list[str]:
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        rows = conn.execute(sql.SQL("SELECT nspname FROM pg_namespace ORDER BY 1")).fetchall()
    return [r[0] for r in rows]


def test_the_server_stays_responsive_after_the_hostile_batch(url: str) -> None:
    started = time.monotonic()
    for _ in range(3):
        httpx.post(
            url + "/v1/sessions",
            content=b"{" * 100_000,
            headers={"content-type": "application/json"},
        )
    poll(lambda: httpx.get(f"{url}/healthz").status_code == 200, 10, "healthy")
    assert time.monotonic() - started < scaled(10)


NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e400", "-1E+400", "1" + "0" * 400 + ".5"]


def test_numbers_json_cannot_represent_are_refused_in_every_free_form_field(
    url: str, settings: Settings, database: Database, runtime: Runtime
) -> None:
    """``{"metadata": {"x": NaN}}`` was stored as a bare NaN (not JSON) and read back as null."""
    sid = session(url)
    _, call_id = interrupted(url, runtime, sid)
    resolve = f"/v1/sessions/{sid}/tool-calls/{call_id}/resolve"
    raw = {"content-type": "application/json"}
    before = head(database, settings)
    for number in NON_FINITE:
        bodies = {
            "/v1/sessions": [
                f'{{"metadata": {{"x": {number}}}}}',
                f'{{"metadata": {{"deep": [1, {{"y": [{number}]}}]}}}}',
            ],
            resolve: [
                f'{{"outcome": "succeeded", "result": {number}, "note": "n", "actor": "a"}}',
                f'{{"outcome": "failed", "result": {{"a": [{number}]}}, "note": "n", "actor": "b"'
                "}",
            ],
        }
        for path, contents in bodies.items():
            for content in contents:
                refused = httpx.post(url + path, content=content.encode(), headers=raw, timeout=30)
                assert refused.status_code == 422, (content, refused.text)
                assert refused.json()["code"] == "validation_error"
                assert "JSON cannot represent" in refused.json()["detail"]
    assert head(database, settings) == before
    # The same words inside strings are text, and stored as such.
    kept = post(url, "/v1/sessions", {"metadata": {"x": "NaN Infinity 1e400"}})
    assert kept.status_code == 201
    assert kept.json()["metadata"]["x"] == "NaN Infinity 1e400"
