"""A process SIGKILLed between its context summary and the request that needed it.

The summary is recorded before the request is sent; the process that takes
over must send the request with that same summary, not make another one.
"""

from __future__ import annotations

import os
import signal

import pytest

from tests import deadlines
from tests.conftest import raw_events, spawn_turnlog
from turnlog.application.errors import LeaseLost
from turnlog.application.providers.port import ModelReply, ProviderRegistry
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database
from turnlog.domain.compaction import is_summarizing
from turnlog.domain.request import SUMMARY_NAME, ModelRequest, summary_message
from turnlog.domain.session import Session
from turnlog.interface.bootstrap import build_runtime

pytestmark = pytest.mark.fault

COMPACTED = Session.ContextCompacted.TOPIC


class Answering:
    """Answers at once and keeps every request (the resumed step's must carry the summary)."""

    name = "fixture"

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    def complete(self, request: ModelRequest) -> ModelReply:
        self.requests.append(request)
        return ModelReply("resumed")


def test_a_process_killed_after_its_summary_resumes_with_that_summary(
    settings: Settings, database: Database
) -> None:
    rt = build_runtime(settings)
    try:
        sid = rt.sessions.create_session(context_max_turns=3).session_id
        for message in ("The codeword is kite", "two", "three"):
            assert rt.send(sid, message).turn.state == "completed"
    finally:
        rt.close()

    # The fourth turn needs a summary first; its request then takes a minute
    # (the fixture's /slow), and the process is killed while it is out.
    proc = spawn_turnlog(settings, "sessions", "send", str(sid), "/slow 60 four")
    try:
        deadlines.poll(
            lambda: COMPACTED in [r[3] for r in raw_events(database, settings.namespace, sid)],
            60,
            "ContextCompacted recorded",
        )
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    topics = [r[3] for r in raw_events(database, settings.namespace, sid)]
    assert topics[-1] == COMPACTED  # nothing after it: the request never returned

    rt = build_runtime(settings)
    provider = Answering()
    rt.executor.providers = ProviderRegistry([provider], "fixture")
    try:

        def resumed() -> bool:
            try:
                rt.continue_session(sid)
            except LeaseLost:
                return False  # the dead process's lease is not released yet
            return True

        deadlines.poll(resumed, 30, "the session's lease free again")
        session = rt.sessions.get_session(sid)
    finally:
        rt.close()

    topics = [r[3] for r in raw_events(database, settings.namespace, sid)]
    assert topics.count(COMPACTED) == 1
    assert session.turn_count == 4 and session.last_turn is not None
    assert str(session.last_turn.state) == "completed"
    assert not any(is_summarizing(r) for r in provider.requests)
    [request] = provider.requests
    [summary] = [m for m in request.messages if m.name == SUMMARY_NAME]
    assert session.compaction is not None
    assert summary == summary_message(session.compaction)
    assert "The codeword is kite." in summary.content
    assert request.messages[-1].content == "/slow 60 four"
