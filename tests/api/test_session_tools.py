"""A session's tools are chosen when it is created; a real model is not offered the demo tools."""

from __future__ import annotations

import json
import subprocess
import sys

from fastapi.testclient import TestClient

from tests.api.conftest import new_session
from tests.conftest import ROOT, turnlog, turnlog_env
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.domain.session import Session


def tools_of(client: TestClient, session_id: str) -> list[str]:
    tools: list[str] = client.get(f"/v1/sessions/{session_id}").json()["tools"]
    return tools


def test_the_default_tools_depend_on_the_provider_and_an_empty_choice_offers_none(
    full: TestClient, runtime: Runtime
) -> None:
    demo = ["append_file", "echo", "sleep"]
    assert tools_of(full, new_session(full)) == demo  # the fixture provider: all of them
    real = new_session(full, provider="openai", model="m")
    assert tools_of(full, real) == []  # a real model: none of the demo tools
    chosen = new_session(full, tools=["echo"])
    assert tools_of(full, chosen) == ["echo"]

    none = new_session(full, tools=[])
    turn = full.post(
        f"/v1/sessions/{none}/turns?wait=20", json={"message": '/tool echo {"text": "x"}'}
    ).json()
    assert turn["state"] == "failed" and "unknown tool 'echo'" in turn["error"], turn
    allowed = full.post(
        f"/v1/sessions/{chosen}/turns?wait=20", json={"message": '/tool echo {"text": "x"}'}
    ).json()
    assert allowed["state"] == "completed", allowed


def test_an_unknown_tool_is_refused_when_the_session_is_created(api: TestClient) -> None:
    refused = api.post("/v1/sessions", json={"tools": ["echo", "rm_rf"]})
    assert refused.status_code == 422 and "unknown tools: rm_rf" in refused.text


def test_sessions_new_takes_tools_and_the_settings_give_the_default(settings: Settings) -> None:
    def new(*args: str, **env: str) -> list[str]:
        created = turnlog(settings, "sessions", "new", *args)
        assert created.returncode == 0, created.stderr
        shown = turnlog(settings, "sessions", "show", created.stdout.strip(), "--json")
        tools: list[str] = json.loads(shown.stdout)["tools"]
        return tools

    assert new() == ["append_file", "echo", "sleep"]
    assert new("--tools", "echo,sleep") == ["echo", "sleep"]
    assert new("--tools", "") == []
    assert new("--provider", "openai") == []
    refused = turnlog(settings, "sessions", "new", "--tools", "echo,nope")
    assert refused.returncode == 2 and "unknown tools: nope" in refused.stderr
    configured = settings.model_copy(update={"default_tools": "sleep"})
    assert new_with(configured) == ["sleep"]


def new_with(settings: Settings) -> list[str]:
    env = turnlog_env(settings, TURNLOG_DEFAULT_TOOLS=settings.default_tools or "")
    created = subprocess.run(
        [sys.executable, "-m", "turnlog", "sessions", "new"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )
    assert created.returncode == 0, created.stderr
    shown = turnlog(settings, "sessions", "show", created.stdout.strip(), "--json")
    tools: list[str] = json.loads(shown.stdout)["tools"]
    return tools


def test_sessions_stored_before_the_choice_was_recorded_still_offer_every_tool() -> None:
    old = Session.start(tools=[])  # as stored before: no tools_chosen, empty means all
    assert not old.tools_chosen and old.allows_tool("echo")
    chosen = Session.start(tools=[], tools_chosen=True)
    assert not chosen.allows_tool("echo")
    payload = {k: v for k, v in chosen.collect_events()[0].__dict__.items() if k != "tools_chosen"}
    replayed = Session.Started(**payload).mutate(None)
    assert replayed is not None and replayed.allows_tool("echo")
