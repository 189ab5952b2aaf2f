"""Lease loss is not death: a live worker whose lease connection the server drops.

The server terminates the backend holding a session's lease
(``pg_terminate_backend``) while the owner's side-effecting tool call is
running. The owner is alive: it takes the lease back at once and, if no one
claimed the turn meanwhile, records its result and finishes the turn. Only
when another process claimed the turn (here: interrupted it while the owner
was stopped) does the owner write nothing. In every case the side effect
happens once.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.deadlines import fault_window
from tests.fault.cluster import Cluster, cluster, poll
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database

pytestmark = pytest.mark.fault

DELAY = 4  # seconds append_file waits before writing (stretched): the kill lands inside it


@pytest.fixture
def running(settings: Settings, database: Database) -> Iterator[Cluster]:
    with cluster(settings, database) as c:
        c.api("api")
        c.projections()
        yield c


def append_call(delay: int) -> str:
    return f'/tool append_file {{"path": "out.txt", "text": "written", "delay_seconds": {delay}}}'


def lines(settings: Settings, session_id: str) -> list[str]:
    path: Path = settings.sandbox_root / session_id / "out.txt"
    return path.read_text().splitlines() if path.exists() else []


def start_append(c: Cluster) -> tuple[str, str, int]:
    """A session whose append_file call has started; its id, turn id and lease backend."""
    session_id = c.new_session()
    # Stretched as the waits are, so that a slow but right retake still lands inside it.
    turn_id = c.submit(session_id, append_call(fault_window(DELAY))).json()["turn_id"]
    poll(lambda: "ToolCallStarted" in c.topics(session_id), 30, "the call started")
    backend = poll(lambda: c.lease_backend(session_id), 10, "the lease connection")
    return session_id, turn_id, backend


def ended(c: Cluster, session_id: str, turn_id: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        turn = c.turn(session_id, turn_id)
        return turn if turn["state"] in ("completed", "interrupted") else None

    return poll(check, 60, "the turn completed or interrupted")


def test_a_worker_whose_lease_connection_is_killed_takes_it_back_and_records_its_result(
    running: Cluster, settings: Settings
) -> None:
    c = running
    worker = c.worker("w1")
    session_id, turn_id, backend = start_append(c)
    c.terminate_backend(backend)
    killed = time.monotonic()
    # Taken back at once, while the tool is still in its delay.
    retaken = poll(
        lambda: (pid := c.lease_backend(session_id)) not in (None, backend) and pid,
        DELAY / 2,
        "the lease taken back on a new connection",
    )
    print(f"lease taken back {time.monotonic() - killed:.3f} s after its backend was terminated")
    assert "ToolCallSucceeded" not in c.topics(session_id), "the tool ended before the retake"
    turn = ended(c, session_id, turn_id)
    assert turn["state"] == "completed", turn
    topics = c.topics(session_id)
    assert topics.count("ToolCallStarted") == 1
    assert topics.count("ToolCallSucceeded") == 1
    assert topics.count("TurnClaimed") == 1
    assert "TurnInterrupted" not in topics
    assert lines(settings, session_id) == ["written"]
    assert retaken != backend
    assert "taken back" in worker.output()


def test_with_a_second_worker_racing_the_result_is_recorded_once_or_the_turn_interrupted(
    running: Cluster, settings: Settings
) -> None:
    c = running
    workers = [c.worker("w1"), c.worker("w2")]
    started = [start_append(c) for _ in range(3)]
    for _, _, backend in started:
        c.terminate_backend(backend)
    recorded = 0
    for session_id, turn_id, _ in started:
        turn = ended(c, session_id, turn_id)
        # The owner's call runs to its end either way: one line, never two.
        poll(lambda: lines(settings, session_id), 30, "the call's line")  # noqa: B023
        assert lines(settings, session_id) == ["written"]
        topics = c.topics(session_id)
        assert topics.count("ToolCallStarted") == 1
        if turn["state"] == "completed":
            # The owner took its lease back before anyone claimed: its result stands.
            assert topics.count("ToolCallSucceeded") == 1
            assert topics.count("TurnClaimed") == 1
            assert "TurnInterrupted" not in topics
            recorded += 1
        else:
            # The other worker claimed first: the owner wrote nothing after it.
            assert topics[-1] == "TurnInterrupted", topics
            assert "ToolCallSucceeded" not in topics
    print(f"lease loss with a second worker: {recorded} of {len(started)} results recorded")
    # The owner is alive and retakes within milliseconds; the other worker looks
    # for orphans once a second. Before, every one of these turns was interrupted.
    assert recorded >= 1, "every turn was taken over although its owner was alive"
    assert all(p.proc.poll() is None for p in workers)


def test_a_worker_that_finds_its_turn_claimed_meanwhile_writes_nothing(
    running: Cluster, settings: Settings
) -> None:
    c = running
    first = c.worker("w1")
    session_id, turn_id, backend = start_append(c)
    first.signal(signal.SIGSTOP)
    try:
        c.terminate_backend(backend)
        c.worker("w2")
        poll(lambda: c.turn(session_id, turn_id)["state"] == "interrupted", 30, "interruption")
        before = c.topics(session_id)
    finally:
        first.signal(signal.SIGCONT)
    # Resumed, it finishes its call (the line is written once) and may take the
    # free lease back, but the turn is no longer its own: it records nothing.
    poll(lambda: lines(settings, session_id) == ["written"], 30, "the resumed call's line")
    poll(lambda: "stopped working on session" in first.output(), 30, "the owner giving up")
    assert c.topics(session_id) == before
    assert c.turn(session_id, turn_id)["state"] == "interrupted"
    assert first.proc.poll() is None
