"""`turnlog worker` and `turnlog projections run` serve metrics on a port of their own.

Real processes: a projections runner and a worker, each with --metrics-port,
JSON logs on; a turn submitted through the application is executed by the
worker, and both ports are scraped.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator

import httpx
import pytest

from tests.fault.cluster import Process, free_port, poll
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings

pytestmark = pytest.mark.fault


@pytest.fixture
def processes() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for process in started:
        process.kill()


def scrape(port: int) -> str:
    try:
        response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    except httpx.TransportError:
        return ""
    return response.text if response.status_code == 200 else ""


def test_worker_and_projection_runner_expose_their_metrics(
    settings: Settings, runtime: Runtime, processes: list[Process]
) -> None:
    projections_port, worker_port = free_port(), free_port()
    json_logs = {"TURNLOG_LOG_FORMAT": "json"}
    runner = Process(
        settings,
        "projections",
        "projections",
        "run",
        "--metrics-port",
        str(projections_port),
        **json_logs,
    )
    worker = Process(settings, "worker", "worker", "--metrics-port", str(worker_port), **json_logs)
    processes += [runner, worker]

    sid = runtime.sessions.create_session(title="m", tools=runtime.executor.tools.names())
    turn_id = runtime.sessions.submit_turn(sid.session_id, '/tool echo {"text": "m"}').turn_id
    poll(
        lambda: runtime.sessions.get_session(sid.session_id).turn_state(turn_id) == "completed",
        30,
        "the worker completed the turn",
    )
    worker_metrics = poll(
        lambda: (
            'turnlog_executed_turns_total{outcome="completed"} 1.0' in (m := scrape(worker_port))
            and m
        ),
        10,
        "the worker's metrics",
    )
    # The runner serves its metrics from its start, before it leads its read models.
    runner_metrics = poll(
        lambda: (
            'turnlog_projection_runner_active{projection="open_turns"} 1.0'
            in (m := scrape(projections_port))
            and m
        ),
        30,
        "the runner's metrics, open_turns led",
    )

    assert (
        'turnlog_executed_tool_calls_total{outcome="succeeded",tool="echo"} 1.0' in worker_metrics
    )
    assert "turnlog_model_call_duration_seconds_bucket" in worker_metrics
    assert 'turnlog_db_pool_connections{pool="sessions",state="max"} 10.0' in worker_metrics
    assert "turnlog_worker_concurrency 4.0" in worker_metrics
    assert 'turnlog_projection_runner_active{projection="open_turns"} 1.0' in runner_metrics
    assert 'turnlog_projection_lag_events{projection="sessions"}' in runner_metrics
    assert httpx.get(f"http://127.0.0.1:{worker_port}/healthz", timeout=5).status_code == 200

    for process in (worker, runner):
        process.signal(signal.SIGTERM)
        assert process.wait() == 0, process.output()
        lines = [json.loads(line) for line in process.output().splitlines() if line.strip()]
        assert lines[-1]["message"] in ("stopped", "worker stopped (0 turn(s) were held)")
    executed = [e for e in lines_of(worker) if e["logger"] == "turnlog.execution"]
    assert executed and all(e["session_id"] == str(sid.session_id) for e in executed)
    assert all(e["worker_id"] and e["turn_id"] == turn_id for e in executed)


def lines_of(process: Process) -> list[dict[str, str]]:
    return [json.loads(line) for line in process.output().splitlines() if line.strip()]
