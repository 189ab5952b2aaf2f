"""Start-up logs say what recovery decided, then what it did, never a plan as a deed."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any
from uuid import UUID

import pytest

from tests import deadlines
from turnlog.application.execution.worker import Worker
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.domain.turns import Effect
from turnlog.interface.bootstrap import OpenTurnsSource
from turnlog.projections import ReadModels
from turnlog.projections.catalog import READ_MODELS
from turnlog.projections.catch_up import catch_up


def poll(check: Callable[[], Any], deadline: float, what: str) -> Any:
    return deadlines.poll(check, deadline, what)


def orphan_a_side_effecting_call(runtime: Runtime) -> tuple[UUID, str]:
    """A running turn whose (dead) worker had started append_file: recovery must interrupt."""
    sessions = runtime.sessions
    sid = sessions.create_session(title="orphan", tools=runtime.executor.tools.names()).session_id
    turn_id = sessions.submit_turn(sid, "/tool append_file {}").turn_id
    claim, _ = sessions.update(sid, lambda s: s.claim_turn(turn_id, "gone:1:dead"))
    call = {"call_id": "call_1", "name": "append_file", "arguments": {"path": "a", "text": "b"}}
    sessions.update(sid, lambda s: s.record_model_reply(turn_id, claim, "", [call]))
    sessions.update(
        sid,
        lambda s: s.start_tool_call(turn_id, claim, "call_1", "gone:1:dead", Effect.SIDE_EFFECTING),
    )
    return sid, turn_id


def test_start_up_logs_the_decision_then_the_interruption_once_it_is_recorded(
    runtime: Runtime, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    sid, turn_id = orphan_a_side_effecting_call(runtime)
    read_models = ReadModels(runtime.db, settings, sessions=runtime.sessions)
    catch_up(read_models.events, runtime.db, settings.namespace, READ_MODELS["open_turns"])
    worker = Worker(runtime, OpenTurnsSource(read_models), concurrency=1)
    caplog.set_level(logging.INFO, logger="turnlog")
    try:
        summary = worker.start()
        assert summary == "1 open turn: 1 to interrupt"
        start_up = [r.getMessage() for r in caplog.records if "start-up check" in r.getMessage()]
        assert start_up == ["start-up check decided: 1 open turn: 1 to interrupt"]
        poll(
            lambda: runtime.sessions.get_session(sid).turns[-1].state == "interrupted",
            30,
            "the turn interrupted",
        )
        done = poll(
            lambda: [r for r in caplog.records if r.getMessage().startswith("recovery done")],
            10,
            "the recovery logged as done",
        )
        assert done[0].getMessage() == f"recovery done: turn {turn_id} interrupted"
        said_interrupted = [
            r for r in caplog.records if "interrupted" in r.getMessage() and r not in done
        ]
        assert said_interrupted == [], [r.getMessage() for r in said_interrupted]
    finally:
        worker.stop(drain_timeout=5)


def test_starting_a_queued_turn_is_no_recovery_at_info(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="turnlog")
    sid = runtime.sessions.create_session(title="plain").session_id
    runtime.send(sid, "hello")  # submitted and claimed in one save: nothing to decide
    runtime.sessions.submit_turn(sid, "again")
    runtime.continue_session(sid)  # a queued turn, started: nothing was recovered
    said = [r for r in caplog.records if r.getMessage().startswith("recovery:")]
    assert [(r.levelno, r.getMessage()) for r in said] == [(logging.DEBUG, "recovery: start")]

    caplog.clear()
    orphan, _ = orphan_a_side_effecting_call(runtime)
    runtime.continue_session(orphan)  # its owner is gone: a recovery, said at INFO
    said = [r for r in caplog.records if r.getMessage().startswith("recovery:")]
    assert [(r.levelno, r.getMessage()) for r in said] == [(logging.INFO, "recovery: interrupt")]
