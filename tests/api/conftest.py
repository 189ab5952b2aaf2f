"""Fixtures for the HTTP API: the app over a real PostgreSQL, in-process or on a real port."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any
from uuid import UUID

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests import deadlines
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.domain.turns import Effect
from turnlog.interface.http import create_app
from turnlog.interface.http.state import Options

# Short timings so that timeouts are observable within a test's budget.
FAST = Options(
    max_streams=4,
    heartbeat_seconds=0.5,
    min_position_timeout=0.5,
    start_retry_seconds=0.2,
    drain_timeout=10.0,
)
# For an app whose read models are kept (runners in the test): a read with
# ?min_position waits for them as long as a slow machine needs. Another test's
# open transaction (on another test worker) holds the commit horizon back, and
# with it every read model, for as long as it runs.
CATCHING_UP = replace(FAST, min_position_timeout=deadlines.scaled(10))

APPEND = {"path": "out.txt", "text": "written"}


@pytest.fixture
def api(settings: Settings, runtime: Runtime) -> Iterator[TestClient]:
    """The API alone (role ``api``): turns are recorded and stay queued; nothing executes."""
    app = create_app(settings, role="api", options=FAST)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


@pytest.fixture
def full(settings: Settings, runtime: Runtime) -> Iterator[TestClient]:
    """The API with a worker and the projection runners in this process (role ``all``)."""
    app = create_app(settings, role="all", options=FAST, worker_concurrency=2)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def new_session(client: TestClient, **body: Any) -> str:
    response = client.post("/v1/sessions", json=body)
    assert response.status_code == 201, response.text
    return str(response.json()["session_id"])


def problem(response: Any, status: int, code: str) -> dict[str, Any]:
    """Assert ``response`` is an RFC 9457 problem with this status and code; return it."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    assert body["code"] == code
    assert body["type"].endswith(code.replace("_", "-"))
    assert body["title"] and body["detail"]
    assert body["request_id"] == response.headers["x-request-id"]
    return body


def interrupt_a_turn(runtime: Runtime, session_id: str) -> tuple[str, str]:
    """Leave the session's turn interrupted as a worker dying inside append_file would.

    The steps a worker records (claim, model reply, the call's start) are
    recorded under a worker id that holds no lease; recovery then finds the
    owner gone with a side-effecting call in flight and interrupts the turn.
    Returns (turn_id, call_id).
    """
    sid = UUID(session_id)
    sessions = runtime.sessions
    turn_id = sessions.submit_turn(sid, "/tool append_file {}").turn_id
    call_id = f"call_{turn_id[:8]}"
    claim, _ = sessions.update(sid, lambda s: s.claim_turn(turn_id, "gone:1:dead"))
    call = {"call_id": call_id, "name": "append_file", "arguments": APPEND}
    sessions.update(sid, lambda s: s.record_model_reply(turn_id, claim, "", [call]))
    sessions.update(
        sid,
        lambda s: s.start_tool_call(turn_id, claim, call_id, "gone:1:dead", Effect.SIDE_EFFECTING),
    )
    verdicts = runtime.continue_session(sid)
    assert [v.decision for v in verdicts] == ["interrupt"], verdicts
    return turn_id, call_id


def eventually(check: Callable[[], Any], deadline: float = 20.0, every: float = 0.05) -> Any:
    """Poll ``check`` until it returns something truthy, or fail at the deadline
    (stretched by the machine's slowness, tests/deadlines.py)."""
    return deadlines.poll(check, deadline, f"{check}", every)


def caught_up(ask: Callable[[], Any], deadline: float = 60.0) -> Any:
    """``ask()``'s answer once it is not 503 ``read_model_lagging``, asked again until then.

    A read model still catching up (restarted, or held back by another client's
    open transaction) answers a ``min_position`` read that way: a right answer,
    not yet the one the test is after. Any other answer is returned at once.
    """

    def answer() -> Any:
        response = ask()
        lagging = response.status_code == 503 and "read_model_lagging" in response.text
        return None if lagging else response

    return eventually(answer, deadline)


@contextmanager
def live_server(app: FastAPI) -> Iterator[str]:
    """Run ``app`` under uvicorn on a free loopback port in a thread; yield its base URL."""
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_config=None, lifespan="on", timeout_graceful_shutdown=5
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    try:
        eventually(lambda: server.started or not thread.is_alive(), deadline=30)
        assert server.started, "the server did not start"
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        app.state.turnlog.draining.set()  # end live streams, as SIGTERM does in `serve`
        server.should_exit = True
        thread.join(20)


def run_queued_turn(runtime: Runtime, session_id: str) -> None:
    """Execute the session's queued turn in this thread, as a worker would."""
    runtime.continue_session(UUID(session_id))
