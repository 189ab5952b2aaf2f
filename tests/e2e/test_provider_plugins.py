"""Your own model provider, named in settings, in every process of every role.

A plugin is a factory named ``module:attribute`` by TURNLOG_PROVIDER_MODULES
(or by a ``turnlog.providers`` entry point): ``serve --split``'s worker child
loads it as ``serve`` does, and a bad one stops start-up with its cause.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, turnlog_env
from tests.e2e.test_serve import ask, wait_ready
from tests.fault.cluster import free_port
from turnlog.application.errors import ConfigurationError
from turnlog.application.providers.plugins import entry_point_tool_modules
from turnlog.application.settings import Settings
from turnlog.application.tools.port import ToolRegistry
from turnlog.interface.bootstrap import build_providers

pytestmark = pytest.mark.fault

PLUGIN = """
import os

from turnlog.application.providers.port import ModelReply


class Shouting:
    name = "shouting"

    def __init__(self, context):
        self.model = context.default_model

    def complete(self, request):
        text = request.messages[-1].content.upper()
        return ModelReply(f"{text} (pid {os.getpid()})")


def make(context):
    return Shouting(context)


def not_a_provider(context):
    return object()


def broken(context):
    raise RuntimeError("no key")


taken = lambda context: type("Again", (), {"name": "fixture", "complete": lambda s, r: None})()
"""


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "shout.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(folder))
    return folder


def test_a_plugin_provider_answers_turns_in_the_split_worker_child(
    settings: Settings, plugin_dir: Path, tmp_path: Path
) -> None:
    port, log = free_port(), tmp_path / "serve.log"
    env = turnlog_env(
        settings,
        TURNLOG_PROVIDER_MODULES="shout:make",
        TURNLOG_PROVIDER="shouting",
        PYTHONPATH=os.pathsep.join([str(plugin_dir), os.environ.get("PYTHONPATH", "")]),
    )
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "turnlog", "serve", "--split", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, url, log)
        sid = httpx.post(f"{url}/v1/sessions", json={}, timeout=10).json()["session_id"]
        reply = ask(url, sid, "hello plugin")["reply"]
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert reply.startswith("HELLO PLUGIN (pid ")
    # Answered by the worker child, not by serve itself.
    assert int(reply.rsplit(" ", 1)[1].rstrip(")")) != proc.pid


@pytest.mark.parametrize(
    ("name", "cause"),
    [
        ("nowhere:make", "provider module 'nowhere' cannot be imported"),
        ("shout:absent", "provider module 'shout' has no 'absent'"),
        ("shout:not_a_provider", "gave object, not a provider"),
        ("shout:broken", "failed to start: RuntimeError: no key"),
        ("shout:taken", "is named 'fixture', a name already taken"),
    ],
)
def test_a_bad_plugin_is_refused_at_start_up_naming_it_and_its_cause(
    settings: Settings, plugin_dir: Path, name: str, cause: str
) -> None:
    bad = settings.model_copy(update={"provider_modules": name})
    with pytest.raises(ConfigurationError, match=cause.replace("(", r"\(").replace(")", r"\)")):
        build_providers(bad, ToolRegistry())


def test_a_default_provider_nobody_offers_is_refused_at_start_up(settings: Settings) -> None:
    bad = settings.model_copy(update={"provider": "nobody"})
    with pytest.raises(ConfigurationError, match="TURNLOG_PROVIDER names 'nobody'"):
        build_providers(bad, ToolRegistry())


def test_an_installed_distribution_offers_providers_and_tools_by_entry_point(
    settings: Settings, plugin_dir: Path
) -> None:
    info = plugin_dir / "shout_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: shout-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[turnlog.providers]\nshouting = shout:make\n\n[turnlog.tools]\nshout_tools = shout_tools\n"
    )
    assert "shouting" in build_providers(settings, ToolRegistry()).names()
    assert "shout_tools" in entry_point_tool_modules()
