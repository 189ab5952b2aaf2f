"""What the model saw: the request rebuilt at a version equals the one the provider received.

The fixture provider is wrapped to keep every request it was sent; turns
(with tool calls and context summaries, so earlier turns are carried by
version range) run in this process; the requests are then rebuilt from the
stored events through HTTP and the CLI.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi.testclient import TestClient

from tests.api.conftest import problem
from tests.conftest import raw_events, turnlog
from turnlog.application.providers.port import FixtureProvider, ModelReply, ProviderRegistry
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.application.views import describe_request
from turnlog.domain.compaction import is_summarizing
from turnlog.domain.request import ModelRequest
from turnlog.domain.session import Session


class Recording(FixtureProvider):
    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    def complete(self, request: ModelRequest) -> ModelReply:
        self.requests.append(request)
        return super().complete(request)


def test_the_request_before_each_reply_is_rebuilt_exactly_and_bad_versions_are_refused(
    runtime: Runtime, settings: Settings, database: Any, api: TestClient
) -> None:
    provider = Recording()
    runtime.executor.providers = ProviderRegistry([provider], "fixture")
    sid = runtime.sessions.create_session(
        system_prompt="You are terse.", context_max_turns=3
    ).session_id
    runtime.send(sid, "The codeword is heron")
    for i in range(6):
        message = f'/tool echo {{"text": "t{i}"}}' if i % 2 == 0 else f"message {i}"
        assert runtime.send(sid, message).turn.state == "completed", i
    sent = [r for r in provider.requests if not is_summarizing(r)]

    rows = raw_events(database, settings.namespace, sid)
    replied = [version for _, _, version, topic in rows if topic == Session.ModelReplied.TOPIC]
    assert len(replied) == len(sent) > 7  # one per turn, one more per tool call
    assert any(topic == Session.ContextCompacted.TOPIC for *_, topic in rows)
    for version, request in zip(replied, sent, strict=True):
        assert runtime.sessions.request_at(sid, version - 1) == request, version

    version = replied[-1] - 1
    answer = api.get(f"/v1/sessions/{sid}/request", params={"version": version})
    assert answer.status_code == 200, answer.text
    assert answer.json() == describe_request(sid, version, sent[-1])
    cli = turnlog(settings, "sessions", "request", str(sid), "--version", str(version), "--json")
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout) == describe_request(sid, version, sent[-1])

    latest = rows[-1][2]
    for bad in (0, -1, latest + 1):
        refused = api.get(f"/v1/sessions/{sid}/request", params={"version": bad})
        problem(refused, 422, "invalid_version")
    refused_cli = turnlog(settings, "sessions", "request", str(sid), "--version", str(latest + 1))
    assert refused_cli.returncode == 2, refused_cli.stdout + refused_cli.stderr
    assert "invalid_version" in refused_cli.stderr
    unknown = api.get(
        "/v1/sessions/00000000-0000-0000-0000-000000000001/request", params={"version": 1}
    )
    assert unknown.status_code == 404
