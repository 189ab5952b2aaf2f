"""A context-window policy: long sessions send short requests, and still remember.

Requests go through the fixture provider, wrapped to keep every request it
was sent; the stored record is read back from PostgreSQL.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest

from tests.conftest import raw_events, turnlog
from turnlog.application.providers.port import (
    FixtureProvider,
    ModelReply,
    ProviderError,
    ProviderRegistry,
)
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.domain.compaction import is_summarizing
from turnlog.domain.request import SUMMARY_NAME, ModelRequest
from turnlog.domain.session import Session
from turnlog.domain.turns import MAX_MESSAGE_BYTES
from turnlog.interface.bootstrap import build_runtime

COMPACTED = Session.ContextCompacted.TOPIC


class Recording(FixtureProvider):
    """The fixture provider, keeping each request; ``summaries`` can be made to fail."""

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []
        self.summarize_with: Any = None  # None: the fixture's summary; an exception or a text

    def complete(self, request: ModelRequest) -> ModelReply:
        self.requests.append(request)
        if is_summarizing(request) and self.summarize_with is not None:
            if isinstance(self.summarize_with, Exception):
                raise self.summarize_with
            return ModelReply(str(self.summarize_with))
        return super().complete(request)


@pytest.fixture
def recording(runtime: Runtime) -> Iterator[Recording]:
    provider = Recording()
    runtime.executor.providers = ProviderRegistry([provider], "fixture")
    yield provider


def turns_after_summary(request: ModelRequest) -> int:
    """How many turns (user messages) a request carries after its summary, if any."""
    messages = list(request.messages)
    marks = [i for i, m in enumerate(messages) if m.name == SUMMARY_NAME]
    after = messages[marks[-1] + 1 :] if marks else messages
    return sum(1 for m in after if m.role == "user")


def new_session(rt: Runtime, **context: int | None) -> UUID:
    return rt.sessions.create_session(
        system_prompt="You are terse.",
        context_max_turns=context.get("max_turns"),
        context_max_chars=context.get("max_chars"),
    ).session_id


def compactions(settings: Settings, database: Any, sid: UUID) -> int:
    return sum(1 for r in raw_events(database, settings.namespace, sid) if r[3] == COMPACTED)


def test_a_300_turn_session_with_max_turns_20_recalls_turn_1_and_sends_at_most_20_turns(
    runtime: Runtime, recording: Recording, settings: Settings, database: Any
) -> None:
    sid = new_session(runtime, max_turns=20)
    assert runtime.send(sid, "The codeword is heron").turn.state == "completed"
    for i in range(298):
        # Every seventh turn calls a tool: its call id must stay unique in the session.
        message = f'/tool echo {{"text": "t{i}"}}' if i % 7 == 0 else f"message {i}"
        assert runtime.send(sid, message).turn.state == "completed", i
    last = runtime.send(sid, "What is the codeword?").turn

    assert last.reply == "The codeword is heron."
    sent = [r for r in recording.requests if not is_summarizing(r)]
    assert len(sent) == 300 + 298 // 7 + 1  # one more request per tool call
    assert max(turns_after_summary(r) for r in sent) <= 20
    assert max(len(r.messages) for r in sent) < 60  # the requests stay short
    # Compactions are rare (about one every ten turns), each recorded once.
    assert 20 <= compactions(settings, database, sid) <= 40
    session = runtime.sessions.get_session(sid)
    assert session.compacted_turns >= 280 and session.compaction is not None
    assert "The codeword is heron." in session.compaction["summary"]


def test_without_a_policy_every_turn_is_sent_as_before(
    runtime: Runtime, recording: Recording, settings: Settings, database: Any
) -> None:
    sid = new_session(runtime)
    for i in range(25):
        runtime.send(sid, f"message {i}")

    assert turns_after_summary(recording.requests[-1]) == 25
    assert not any(is_summarizing(r) for r in recording.requests)
    assert compactions(settings, database, sid) == 0


def test_max_chars_keeps_every_request_near_the_limit(
    runtime: Runtime, recording: Recording
) -> None:
    sid = new_session(runtime, max_chars=2000)
    runtime.send(sid, "The codeword is osprey")
    for i in range(60):
        runtime.send(sid, f"message {i} " + "x" * 80)

    assert runtime.send(sid, "What is the codeword?").turn.reply == "The codeword is osprey."
    sent = [r for r in recording.requests if not is_summarizing(r)]
    sizes = [sum(len(m.content) for m in r.messages) for r in sent]
    assert max(sizes) <= 2000 + 400  # the limit, plus one turn and the summary's header
    assert any(is_summarizing(r) for r in recording.requests)


@pytest.mark.parametrize(
    ("summary", "reason"),
    [
        (ProviderError("model overloaded"), "context compaction failed: provider error: model"),
        ("x" * (MAX_MESSAGE_BYTES + 1), "context compaction failed: the context summary is"),
        ("   ", "context compaction failed: the context summary is empty"),
    ],
)
def test_a_summary_that_cannot_be_made_fails_the_turn_and_the_session_stays_usable(
    runtime: Runtime,
    recording: Recording,
    settings: Settings,
    database: Any,
    summary: Any,
    reason: str,
) -> None:
    sid = new_session(runtime, max_turns=2)
    runtime.send(sid, "The codeword is wren")
    runtime.send(sid, "second")
    recording.summarize_with = summary
    before = raw_events(database, settings.namespace, sid)

    turn = runtime.send(sid, "third").turn

    assert turn.state == "failed" and turn.error.startswith(reason)
    added = [r[3] for r in raw_events(database, settings.namespace, sid)[len(before) :]]
    assert added == [
        "turnlog.session.TurnSubmitted.v1",
        "turnlog.session.TurnClaimed.v1",
        "turnlog.session.TurnFailed.v1",
    ]
    recording.summarize_with = None
    assert runtime.send(sid, "What is the codeword?").turn.reply == "The codeword is wren."
    assert compactions(settings, database, sid) == 1


def test_audit_and_projections_verify_a_long_compacted_session(
    settings: Settings, database: Any
) -> None:
    rt = build_runtime(settings.model_copy(update={"context_max_turns": 4}))
    try:
        sid = rt.sessions.create_session(context_max_turns=rt.settings.context_max_turns).session_id
        rt.send(sid, "The codeword is plover")
        for i in range(40):
            message = '/tool echo {"text": "x"}' if i % 5 == 0 else f"message {i}"
            assert rt.send(sid, message).turn.state == "completed"
    finally:
        rt.close()
    assert compactions(settings, database, sid) >= 10

    audit = turnlog(settings, "audit", str(sid), "--verify", timeout=120)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    verify = turnlog(settings, "projections", "verify", timeout=120)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    shown = json.loads(turnlog(settings, "sessions", "show", str(sid), "--json").stdout)
    assert shown["context"] == {"max_turns": 4, "max_chars": None}
    assert "The codeword is plover." in shown["compaction"]["summary"]
    assert shown["turn_count"] == 41 and len(shown["turns"]) == 20
    assert shown["turns"][-1]["message"] == "message 39"
    every = json.loads(turnlog(settings, "sessions", "show", str(sid), "--json", "--all").stdout)
    assert [t["message"] for t in every["turns"]][:2] == [
        "The codeword is plover",
        '/tool echo {"text": "x"}',
    ]
    assert len(every["turns"]) == 41


@pytest.mark.parametrize("options", [["--context-max-turns", "0"], ["--context-max-chars", "999"]])
def test_sessions_new_refuses_a_context_policy_out_of_range(
    runtime: Runtime, settings: Settings, database: Any, options: list[str]
) -> None:
    before = raw_events(database, settings.namespace)

    result = turnlog(settings, "sessions", "new", *options)

    assert result.returncode == 2, result.stdout + result.stderr
    assert "context max_" in result.stderr
    assert raw_events(database, settings.namespace) == before
