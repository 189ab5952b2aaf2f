"""A built-in tool stuck in a system call holds no worker slot: timeout, cancel and force end it.

The stuck call is real: ``append_file``'s write is made to open a named pipe
with a blocking ``open()`` (as a file system that does not answer would
hold it), and the tool runs through the runtime as a model's call does.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from tests.deadlines import poll, scaled
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.application.tools import builtin
from turnlog.application.tools.builtin import builtin_tools
from turnlog.application.tools.context import ToolContext
from turnlog.application.tools.port import ToolError, ToolOutcomeUnknown, ToolRegistry
from turnlog.interface.bootstrap import build_runtime

CALL = '/tool append_file {"path": "out.txt", "text": "x"}'


@pytest.fixture
def stuck(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Make append_file's write block in open() on a pipe until the test ends."""
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)

    def blocking_append(sandbox: Path, relative: str, line: str) -> str:
        fd = os.open(pipe, os.O_WRONLY)  # blocks until a reader opens the pipe
        os.close(fd)
        return relative

    monkeypatch.setattr(builtin, "append_line", blocking_append)
    yield pipe
    # Release the threads left in open(): a reader lets each open return.
    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    os.close(reader)


def _bounded(action: Any, seconds: float) -> Any:
    """Run ``action`` on a thread; fail (instead of hanging the run) if it does not return."""
    done: list[Any] = []

    def target() -> None:
        try:
            done.append(("returned", action()))
        except BaseException as exc:
            done.append(("raised", exc))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(scaled(seconds))
    assert done, f"still blocked after {scaled(seconds):.0f}s"
    return done[0]


def _context(tmp_path: Path, stop: threading.Event | None = None) -> ToolContext:
    sandbox = tmp_path / "sandboxes" / "s1"
    sandbox.mkdir(parents=True, exist_ok=True)
    return ToolContext("s1", "c1", 1, sandbox, stop=stop or threading.Event())


def test_a_stuck_append_file_ends_at_its_timeout_with_an_unknown_outcome(
    stuck: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(builtin, "BUILTIN_TIMEOUT", 0.3)
    tool = ToolRegistry(builtin_tools()).get("append_file")
    assert tool is not None

    kind, value = _bounded(lambda: tool.run({"path": "a", "text": "x"}, _context(tmp_path)), 10)

    assert kind == "raised" and isinstance(value, ToolOutcomeUnknown), value
    assert "timed out after 0.3s" in str(value)


def test_a_stuck_call_returns_as_soon_as_it_is_stopped(stuck: Path, tmp_path: Path) -> None:
    tool = ToolRegistry(builtin_tools()).get("append_file")
    assert tool is not None
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()

    kind, value = _bounded(
        lambda: tool.run({"path": "a", "text": "x"}, _context(tmp_path, stop)), 5
    )

    assert kind == "raised" and isinstance(value, ToolOutcomeUnknown), value
    assert "stopped while it ran" in str(value)


def test_sleep_is_stopped_by_its_stop_event_and_bounded(tmp_path: Path) -> None:
    tool = ToolRegistry(builtin_tools()).get("sleep")
    assert tool is not None
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()

    kind, value = _bounded(lambda: tool.run({"seconds": 60}, _context(tmp_path, stop)), 5)

    assert kind == "returned" and value == {"slept": 60.0}, value  # recorded as stopped


def test_a_read_only_function_tool_that_overruns_fails(tmp_path: Path) -> None:
    tool = ToolRegistry(builtin_tools()).get("sleep")
    assert tool is not None
    bounded = type(tool)(tool.spec, tool.function, timeout=0.1)  # type: ignore[attr-defined]

    kind, value = _bounded(lambda: bounded.run({"seconds": 60}, _context(tmp_path)), 5)

    assert kind == "raised" and isinstance(value, ToolError), value
    assert "timed out after 0.1s" in str(value)


def _turn_running_the_call(runtime: Runtime) -> tuple[UUID, str, threading.Thread]:
    session_id = runtime.sessions.create_session(tools=["append_file"]).session_id
    thread = threading.Thread(target=runtime.send, args=(session_id, CALL), daemon=True)
    thread.start()

    def started() -> str | None:
        session = runtime.sessions.get_session(session_id)
        turn = session.open_turn
        if turn is None or not any(c.state == "started" for c in session.in_flight_calls(turn)):
            return None
        return turn.turn_id

    return session_id, poll(started, 30, "the call started"), thread


def test_a_forced_cancel_frees_the_slot_of_a_stuck_call_and_interrupts_the_turn(
    stuck: Path, settings: Settings
) -> None:
    runtime = build_runtime(settings)
    try:
        session_id, turn_id, sending = _turn_running_the_call(runtime)

        runtime.cancel_turn(session_id, turn_id, "stuck", "ops", force=True)
        sending.join(scaled(10))

        assert not sending.is_alive(), "the worker's slot is still held by the stuck call"
        state = runtime.sessions.turn_record(session_id, turn_id)[1].state
        assert state == "interrupted"
    finally:
        runtime.close()


def test_a_plain_cancel_of_a_stuck_side_effecting_call_ends_at_its_timeout(
    stuck: Path, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(builtin, "BUILTIN_TIMEOUT", 1.0)
    runtime = build_runtime(settings)
    try:
        session_id, turn_id, sending = _turn_running_the_call(runtime)

        runtime.cancel_turn(session_id, turn_id, "stuck", "ops")
        sending.join(scaled(15))

        assert not sending.is_alive(), "the worker's slot is still held by the stuck call"
        state = runtime.sessions.turn_record(session_id, turn_id)[1].state
        assert state == "interrupted"  # it may still act: an operator says what happened
    finally:
        runtime.close()
