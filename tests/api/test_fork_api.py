"""Forking a session at a version: the fork's next request is the source's request there.

The fixture provider is wrapped to keep every request it was sent. A source
session runs turns with tool calls and context summaries (so the request at a
version carries a summary and earlier turns by version range); it is forked
between turns, the fork is forked again, and turns run on the forks. Bad
versions, versions inside a turn or at an interrupted one are refused, and
the source's stored events are not touched.
"""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

import psycopg
import pytest
from fastapi.testclient import TestClient
from psycopg import sql

from tests.api.conftest import interrupt_a_turn, new_session, problem
from tests.conftest import raw_events, turnlog
from turnlog.application.errors import SessionPurged
from turnlog.application.forks import fork_session
from turnlog.application.providers.port import FixtureProvider, ModelReply, ProviderRegistry
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings, schema_name
from turnlog.domain.compaction import is_summarizing
from turnlog.domain.request import ModelRequest
from turnlog.domain.session import Session
from turnlog.interface.purging import build_purger
from turnlog.projections import ReadModels

TURN_ENDS = {
    Session.TurnCompleted.TOPIC,
    Session.TurnFailed.TOPIC,
    Session.TurnAbandoned.TOPIC,
    Session.TurnCancelled.TOPIC,
}


class Recording(FixtureProvider):
    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    def complete(self, request: ModelRequest) -> ModelReply:
        self.requests.append(request)
        return super().complete(request)


def _recording(runtime: Runtime) -> Recording:
    provider = Recording()
    runtime.executor.providers = ProviderRegistry([provider], "fixture")
    return provider


def _between_turns(database: Any, namespace: str, session_id: UUID) -> list[int]:
    """Version 1 and the version of every turn's last event: where a fork may be taken."""
    rows = raw_events(database, namespace, session_id)
    return [1] + [version for _, _, version, topic in rows if topic in TURN_ENDS]


def _stored(database: Any, namespace: str, session_id: UUID) -> list[tuple[Any, ...]]:
    query = sql.SQL(
        "SELECT originator_version, topic, state, encode(hash, 'hex') FROM {}.sessions_events"
        " WHERE originator_id = %s ORDER BY originator_version"
    ).format(sql.Identifier(schema_name(namespace)))
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        return conn.execute(query, (session_id,)).fetchall()


def _first_request_of_each_turn(requests: list[ModelRequest]) -> dict[str, ModelRequest]:
    """The first (non-summarising) request sent for each user message, by that message."""
    first: dict[str, ModelRequest] = {}
    for request in requests:
        if is_summarizing(request):
            continue
        user = [m.content for m in request.messages if m.role == "user"][-1]
        first.setdefault(user, request)
    return first


def test_a_fork_between_turns_asks_the_model_what_the_source_asked_there(
    runtime: Runtime, settings: Settings, database: Any
) -> None:
    provider = _recording(runtime)
    sessions = runtime.sessions
    source = sessions.create_session(
        title="source", system_prompt="You are terse.", context_max_turns=3, metadata={"k": "v"}
    ).session_id
    messages = [
        f'/tool echo {{"text": "t{i}"}}' if i % 2 == 0 else f"message {i}" for i in range(7)
    ]
    for message in messages:
        assert runtime.send(source, message).turn.state == "completed", message
    rows = raw_events(database, settings.namespace, source)
    assert any(topic == Session.ContextCompacted.TOPIC for *_, topic in rows)
    before = _stored(database, settings.namespace, source)
    heads = {version: head for version, _, _, head in before}

    versions = _between_turns(database, settings.namespace, source)
    assert len(versions) == len(messages) + 1
    forks: dict[int, UUID] = {}
    for version in versions:
        fork = fork_session(sessions, source, version).session_id
        forks[version] = fork
        request = sessions.request_for(sessions.get_session(fork))
        assert request == sessions.request_at(source, version), version
        [first] = raw_events(database, settings.namespace, fork)
        assert first[3] == "turnlog.session.SessionForked.v1"
        record = sessions.get_session(fork)
        assert record.forked_from == {
            "session_id": str(source),
            "version": version,
            "head": heads[version],
        }
        assert heads[version]  # the chain head is named
        assert (record.title, record.metadata) == ("source", {"k": "v"})
    assert _stored(database, settings.namespace, source) == before  # the source is untouched

    # A turn on a fork taken just before the source's turn k is asked as that turn was.
    sent = _first_request_of_each_turn(provider.requests)
    for k in (3, 5, 6):  # inside the summarised part of the session, with and without tools
        fork = forks[versions[k]]
        provider.requests.clear()
        assert runtime.send(fork, messages[k]).turn.state == "completed"
        assert _first_request_of_each_turn(provider.requests)[messages[k]] == sent[messages[k]]

    # A fork of a fork, at its first event and after a turn of its own.
    parent = forks[versions[4]]
    assert runtime.send(parent, '/tool echo {"text": "own"}').turn.state == "completed"
    assert runtime.send(parent, "after its own turn").turn.state == "completed"
    for version in _between_turns(database, settings.namespace, parent):
        grandchild = fork_session(sessions, parent, version, title="grandchild").session_id
        request = sessions.request_for(sessions.get_session(grandchild))
        assert request == sessions.request_at(parent, version), version
        assert sessions.get_session(grandchild).forked_from["session_id"] == str(parent)
    assert runtime.send(grandchild, "a turn on the fork of a fork").turn.state == "completed"
    grand = sessions.get_session(grandchild)
    assert grand.turn_count == sessions.get_session(parent).turn_count + 1
    # Its turns page in full, inherited ones included (those the next request carries).
    _, page, _ = sessions.turn_page(grandchild, None, 3)
    assert [t.message for _, t in page][:2] == [
        "a turn on the fork of a fork",
        "after its own turn",
    ]

    # The forks never read their source again: they outlive its purge.
    expected = sessions.request_for(sessions.get_session(parent))
    build_purger(runtime, ReadModels(runtime.db, settings, sessions=sessions)).purge(
        source, "erasure", "dpo"
    )
    assert raw_events(database, settings.namespace, source) == []
    assert sessions.request_for(sessions.get_session(parent)) == expected
    assert runtime.send(parent, "after the source is gone").turn.state == "completed"
    with pytest.raises(SessionPurged):
        fork_session(sessions, source, 1)


def test_fork_over_http_and_the_cli_and_what_it_refuses(
    runtime: Runtime, settings: Settings, database: Any, api: TestClient
) -> None:
    sid = new_session(api, title="to fork", metadata={"team": "a"})
    assert runtime.send(UUID(sid), "first").turn.state == "completed"
    latest = len(raw_events(database, settings.namespace, sid))

    answer = api.post(
        f"/v1/sessions/{sid}/fork",
        json={"version": latest, "title": "forked", "metadata": {"team": "b"}},
    )
    assert answer.status_code == 201, answer.text
    body = answer.json()
    assert answer.headers["location"] == f"/v1/sessions/{body['session_id']}"
    assert (body["title"], body["metadata"], body["turn_count"]) == ("forked", {"team": "b"}, 1)
    assert body["forked_from"]["session_id"] == sid
    assert body["forked_from"]["version"] == latest
    assert len(body["forked_from"]["head"]) == 64
    shown = api.get(f"/v1/sessions/{body['session_id']}").json()
    assert shown["forked_from"] == body["forked_from"]
    assert api.get(f"/v1/sessions/{sid}").json()["forked_from"] is None

    # With an Idempotency-Key a repeat finds the same fork; another body with it is refused.
    keyed = {"version": latest, "title": "keyed"}
    headers = {"Idempotency-Key": "fork-once"}
    first = api.post(f"/v1/sessions/{sid}/fork", json=keyed, headers=headers)
    assert first.status_code == 201, first.text
    again = api.post(f"/v1/sessions/{sid}/fork", json=keyed, headers=headers)
    assert again.status_code == 201, again.text
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["session_id"] == first.json()["session_id"]
    assert (again.json()["title"], again.json()["metadata"]["team"]) == ("keyed", "a")
    other = {**keyed, "title": "another"}
    problem(
        api.post(f"/v1/sessions/{sid}/fork", json=other, headers=headers),
        409,
        "idempotency_key_reused",
    )
    # The source's own idempotency record is not inherited.
    marked = api.post("/v1/sessions", json={"title": "m"}, headers={"Idempotency-Key": "src"})
    unmarked = api.post(f"/v1/sessions/{marked.json()['session_id']}/fork", json={"version": 1})
    assert unmarked.status_code == 201, unmarked.text
    assert "turnlog.idempotency" in marked.json()["metadata"]
    assert unmarked.json()["metadata"] == {}

    for bad in (0, -1, latest + 1):
        problem(api.post(f"/v1/sessions/{sid}/fork", json={"version": bad}), 422, "invalid_version")
    problem(
        api.post(f"/v1/sessions/{sid}/fork", json={"version": 1, "metadata": {"turnlog.x": 1}}),
        422,
        "validation_error",
    )
    problem(api.post(f"/v1/sessions/{sid}/fork", json={}), 422, "validation_error")
    for hostile in (
        '{"version": 1, "title": "\\ud800"}',  # a lone surrogate
        '{"version": 1, "metadata": {"k": "\\udfff"}}',
        '{"version": 1e400}',
        '{"version": 1.5}',
    ):
        refused = api.post(
            f"/v1/sessions/{sid}/fork",
            content=hostile,
            headers={"Content-Type": "application/json"},
        )
        assert refused.status_code == 422, (hostile, refused.text)
    unknown = "00000000-0000-0000-0000-000000000001"
    problem(api.post(f"/v1/sessions/{unknown}/fork", json={"version": 1}), 404, "session_not_found")

    # Inside a turn (its submission, claim and reply): refused, naming the turn.
    inside = latest - 1
    refused = problem(
        api.post(f"/v1/sessions/{sid}/fork", json={"version": inside}), 409, "fork_inside_turn"
    )
    assert refused["turn_id"] and refused["state"] == "running"
    turn_id, _ = interrupt_a_turn(runtime, sid)
    interrupted = len(raw_events(database, settings.namespace, sid))
    refused = problem(
        api.post(f"/v1/sessions/{sid}/fork", json={"version": interrupted}),
        409,
        "fork_at_interrupted_turn",
    )
    assert refused["turn_id"] == turn_id
    forks = [
        r for r in raw_events(database, settings.namespace) if r[3].endswith("SessionForked.v1")
    ]
    assert len(forks) == 3  # the refusals wrote nothing

    cli = turnlog(settings, "sessions", "fork", sid, "--version", str(latest), "--json")
    assert cli.returncode == 0, cli.stderr
    assert '"forked_from"' in cli.stdout
    fork_id = json.loads(cli.stdout)["session_id"]
    shown_cli = turnlog(settings, "sessions", "show", fork_id)
    assert shown_cli.returncode == 0, shown_cli.stderr
    assert f"forked from {sid} at version {latest}" in shown_cli.stdout
    refused_cli = turnlog(settings, "sessions", "fork", sid, "--version", str(inside))
    assert refused_cli.returncode == 3, refused_cli.stdout + refused_cli.stderr
    assert "fork_inside_turn" in refused_cli.stderr
    bad_cli = turnlog(settings, "sessions", "fork", sid, "--version", "0")
    assert bad_cli.returncode == 2, bad_cli.stdout + bad_cli.stderr
