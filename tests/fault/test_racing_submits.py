"""No submitted turn stays ``queued``: 200 sessions, 4 workers, submits racing offers and polls.

Under a steady stream of offers the worker used to skip its poll of the open
turns, so a turn whose offer was lost (its lease was held for a moment by a
worker that then let go, a turn refused and benched) waited for the offers
to stop — in a long run, for ever.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from uuid import UUID

import pytest

from tests.deadlines import poll
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.interface.bootstrap import Process, build_process
from turnlog.interface.roles import Role

SESSIONS = 200
WORKERS = 4
SUBMITTERS = 8


@pytest.fixture
def workers(settings: Settings, runtime: Runtime) -> Iterator[list[Process]]:
    started: list[Process] = []
    try:
        for _ in range(WORKERS):
            started.append(build_process(settings, Role.WORKER, worker_concurrency=4).start())
        yield started
    finally:
        for process in started:
            process.stop(drain_timeout=10)


def test_every_submitted_turn_completes_and_none_stays_queued(
    runtime: Runtime, workers: list[Process]
) -> None:
    sessions = [runtime.sessions.create_session(title=f"r{i}").session_id for i in range(SESSIONS)]
    submitted: dict[UUID, str] = {}
    lock = threading.Lock()
    rng = random.Random(15)

    def done(session_id: UUID, turn_id: str) -> bool:
        return runtime.sessions.turn_record(session_id, turn_id)[1].state.value == "completed"

    def submit(share: list[UUID]) -> None:
        # Each session's next turn is submitted the moment its last one is seen
        # completed: while its worker may still hold the lease, racing its release.
        for session_id in share + share[::-1]:
            if session_id in submitted:
                first = (session_id, submitted[session_id])
                poll(lambda first=first: done(*first), 120, "the first turn")  # type: ignore[misc]
            turn_id = runtime.sessions.submit_turn(session_id, f"hello {session_id}").turn_id
            with lock:
                submitted[session_id] = turn_id
            # As an API process does: offer it to one worker at once (racing the
            # other workers' followers, which offer it too, and their polls).
            if rng.random() < 0.5:
                worker = rng.choice(workers).worker
                assert worker is not None
                worker.offer(session_id)

    threads = [
        threading.Thread(target=submit, args=(sessions[i::SUBMITTERS],)) for i in range(SUBMITTERS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(submitted) == SESSIONS

    def unfinished() -> list[str]:
        states = {
            runtime.sessions.turn_record(session_id, turn_id)[1].state.value
            for session_id, turn_id in submitted.items()
        }
        return sorted(states - {"completed"})

    poll(lambda: not unfinished(), 120, "every submitted turn to complete")
    assert all(
        runtime.sessions.turn_record(s, t)[1].reply == f"Echo: hello {s}"
        for s, t in submitted.items()
    )
