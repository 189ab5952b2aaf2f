"""Runners under faults: SIGKILL mid catch-up, standby takeover, a killed LISTEN connection."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from tests import deadlines
from tests.conftest import spawn_turnlog
from tests.deadlines import scaled
from tests.histories import bulk_history
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.projections import ProjectionSupervisor, ReadModels, read_models
from turnlog.projections.rebuild import rebuild, verify

pytestmark = pytest.mark.fault


@pytest.fixture
def read(runtime: Runtime) -> Iterator[ReadModels]:
    models = ReadModels(runtime.db, runtime.settings, sessions=runtime.sessions)
    yield models


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=scaled(10))


def wait_until(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``condition`` (every 10 ms) until it is truthy; fail after ``timeout`` seconds
    stretched by the machine's slowness."""
    return deadlines.poll(condition, timeout, what, every=0.01)


def all_rows(read: ReadModels) -> dict[str, list[dict[str, Any]]]:
    snapshots = {}
    for model in read_models():
        _, rows = model.postgres_view(read.events.datastore).snapshot(read.events.application_name)
        snapshots[model.name] = sorted(rows, key=lambda r: str(model.table.key_of(r)))
    return snapshots


def run_projections(settings: Settings, *args: str) -> subprocess.Popen[str]:
    return spawn_turnlog(settings, "projections", "run", "--poll-interval", "0.2", *args)


def test_a_runner_killed_mid_catch_up_resumes_to_exactly_the_uninterrupted_rows(
    runtime: Runtime, settings: Settings, read: ReadModels, processes: list[subprocess.Popen[str]]
) -> None:
    bulk_history(runtime.sessions, 4000)
    head = read.events.head()

    processes.append(run_projections(settings, "--batch-size", "10"))
    wait_until(lambda: min(read.positions().values()) > 0, 30, "every read model to start")
    processes[0].send_signal(signal.SIGKILL)
    processes[0].wait(10)
    at_kill = read.positions()
    assert min(at_kill.values()) < head, f"caught up before the kill: {at_kill}"
    # Each batch committed whole or not at all: what is there matches its position.
    assert all(result.ok for result in verify(read.events, read_models()))

    processes.append(run_projections(settings))
    assert read.wait_for(head, timeout=scaled(30))
    processes[1].send_signal(signal.SIGTERM)
    assert processes[1].wait(scaled(10)) == 0
    resumed = all_rows(read)

    rebuild(read.events, runtime.db, settings.namespace, read_models())  # an uninterrupted run
    assert all_rows(read) == resumed
    assert len(resumed["sessions"]) > 50 and len(resumed["tool_calls"]) > 200


def holder_pid(read: ReadModels, name: str) -> int | None:
    [status] = read.status([name])
    return int(status["holder"].rsplit(":", 1)[1]) if status["running"] else None


def runner_pids(settings: Settings, name: str) -> set[int]:
    """OS pids of processes whose runner for ``name`` is connected (active or standby)."""
    with psycopg.connect(str(settings.database_url), autocommit=True) as conn:
        labels = conn.execute(
            "SELECT application_name FROM pg_stat_activity WHERE application_name LIKE %s",
            (f"turnlog-projection {name} %",),
        ).fetchall()
    return {int(label.rsplit(":", 1)[1]) for (label,) in labels}


def test_a_standby_runner_takes_over_when_the_active_one_is_killed(
    runtime: Runtime, settings: Settings, read: ReadModels, processes: list[subprocess.Popen[str]]
) -> None:
    processes.extend(run_projections(settings, "--only", "sessions") for _ in range(2))
    pids = {p.pid for p in processes}
    # A subset: runners of other tests (other namespaces, other pytest workers) may be connected.
    wait_until(lambda: pids <= runner_pids(settings, "sessions"), 30, "both runners to connect")
    active = wait_until(lambda: holder_pid(read, "sessions"), 10, "one runner to take the lock")
    assert active in pids
    first = runtime.sessions.create_session(title="before")
    assert read.wait_for(first.position, timeout=scaled(10), names=["sessions"])

    [killed] = [p for p in processes if p.pid == active]
    killed.send_signal(signal.SIGKILL)
    killed.wait(scaled(10))
    second = runtime.sessions.create_session(title="after")
    assert read.wait_for(second.position, timeout=scaled(10), names=["sessions"])
    [standby] = [p for p in processes if p.pid != active]
    assert holder_pid(read, "sessions") == standby.pid
    assert [row["title"] for row in read.list_sessions()[0]] == ["after", "before"]

    standby.send_signal(signal.SIGTERM)
    assert standby.wait(scaled(10)) == 0


def test_a_terminated_listen_connection_does_not_stop_the_projection(
    runtime: Runtime, settings: Settings, read: ReadModels
) -> None:
    with ProjectionSupervisor(
        settings, runtime.db, sessions=runtime.sessions, poll_interval=0.2
    ) as supervisor:
        first = runtime.sessions.create_session(title="before")
        assert read.wait_for(first.position, timeout=scaled(10))

        with psycopg.connect(str(settings.database_url), autocommit=True) as conn:
            terminated = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name LIKE %s",
                (f"turnlog-projection % %:{os.getpid()}",),
            ).fetchall()
        assert len(terminated) == len(read_models())

        # Each runner notices its own connection's end when it next looks at
        # it: one may still fold an event through the pool before it does. So
        # wait for every one to have started again, then write.
        def led_again() -> bool:
            return all(r["restarts"] >= 1 and r["state"] == "active" for r in supervisor.runners())

        wait_until(led_again, 30, "every runner to lead again on a new connection")
        second = runtime.sessions.create_session(title="after")
        assert read.wait_for(second.position, timeout=scaled(10))
    assert [row["title"] for row in read.list_sessions()[0]] == ["after", "before"]
