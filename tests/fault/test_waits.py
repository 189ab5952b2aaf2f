"""Many clients waiting on ``?wait=`` neither starve writers nor grow without bound.

600 clients on ``?wait=60`` used to cut session creation from 13 to 0.9 per
second: every commit woke every waiter and each rebuilt its session. Waiters
are now woken for their own session only, and their number per process is
bounded (503 ``too_many_waits``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import httpx
import pytest

from tests.api.conftest import FAST, live_server
from tests.conftest import raw_events
from tests.fault.cluster import poll
from tests.fault.waiters import wait_in_background
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database
from turnlog.interface.http import create_app

WAITERS = 600
SESSIONS = 30  # 20 waiters per queued turn, joined through its Idempotency-Key
CREATES = 25


@pytest.fixture
def api(settings: Settings, runtime: Runtime) -> Iterator[tuple[str, object]]:
    """An API without a worker: submitted turns stay queued, their waiters wait."""
    app = create_app(
        settings, role="api", options=dataclasses.replace(FAST, max_waits=WAITERS + 10)
    )
    with live_server(app) as url:
        yield url, app


def _create_sessions(url: str, count: int) -> None:
    with httpx.Client(base_url=url, timeout=60) as client:
        for _ in range(count):
            assert client.post("/v1/sessions", json={}).status_code == 201


def test_600_waiters_are_not_woken_by_commits_in_other_sessions(
    api: tuple[str, object], settings: Settings, database: Database
) -> None:
    url, app = api
    with httpx.Client(base_url=url, timeout=30) as client:
        sessions = [
            client.post("/v1/sessions", json={}).json()["session_id"] for _ in range(SESSIONS)
        ]

    waiting = wait_in_background(url, sessions, WAITERS)
    state = app.state.turnlog  # type: ignore[attr-defined]
    poll(lambda: state.waits.watching >= WAITERS, 120, f"{WAITERS} waiters")
    poll(lambda: state.waits.followed == SESSIONS, 60, "every session followed")
    _create_sessions(url, 1)  # settle: the first look at each session woke its waiters
    woken = state.waits.woken
    _create_sessions(url, CREATES)
    still = state.waits.open
    woken_by_the_writer = state.waits.woken - woken

    assert still >= WAITERS  # they were all still waiting while the writer wrote
    # What keeps a writer's rate: its commits woke none of the waiters. Each used to wake all
    # 600, and each rebuilt its session: 14x slower. The rate itself is a timing, measured
    # against a run without waiters by `make bench` (figure 11).
    assert woken_by_the_writer == 0
    state.draining.set()  # release the waiters, as a shutdown does
    waiting.join(60)
    # One turn per session, whatever the number of waiters that joined it.
    turns = [r for r in raw_events(database, settings.namespace) if ".TurnSubmitted." in r[3]]
    assert len(turns) == SESSIONS


def test_waits_past_the_bound_are_refused_before_anything_is_written(
    settings: Settings, runtime: Runtime, database: Database
) -> None:
    app = create_app(settings, role="api", options=dataclasses.replace(FAST, max_waits=3))
    with live_server(app) as url:
        with httpx.Client(base_url=url, timeout=30) as client:
            sessions = [client.post("/v1/sessions", json={}).json()["session_id"] for _ in range(4)]
        waiting = wait_in_background(url, sessions[:3], 3)
        state = app.state.turnlog
        poll(lambda: state.waits.open == 3, 60, "3 waits open")
        # A wait takes its slot before its turn is submitted: let the three submits land.
        poll(lambda: _submitted(database, settings) == 3, 60, "3 turns submitted")
        before = raw_events(database, settings.namespace)
        refused = httpx.post(
            f"{url}/v1/sessions/{sessions[3]}/turns?wait=5", json={"message": "x"}, timeout=30
        )
        assert refused.status_code == 503, refused.text
        assert refused.json()["code"] == "too_many_waits"
        assert int(refused.headers["retry-after"]) > 0
        assert raw_events(database, settings.namespace) == before  # nothing submitted
        without_wait = httpx.post(
            f"{url}/v1/sessions/{sessions[3]}/turns", json={"message": "x"}, timeout=30
        )
        assert without_wait.status_code == 202
        state.draining.set()
        waiting.join(60)
        assert state.waits.open == 0


def _submitted(database: Database, settings: Settings) -> int:
    return sum(".TurnSubmitted." in r[3] for r in raw_events(database, settings.namespace))
