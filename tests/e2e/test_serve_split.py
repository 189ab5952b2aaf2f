"""`turnlog serve --split`: the worker and the read models run as serve's child processes.

They are real children (their pids' parent is serve), run the turns, live
and die with serve: SIGKILL takes all three, SIGTERM drains all three, and a
child that dies stops serve with exit 1.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.api.conftest import eventually
from tests.conftest import turnlog
from tests.e2e.test_serve import ask, server
from tests.fault.cluster import free_port
from turnlog.application.settings import Settings
from turnlog.interface.children import child_env, unsupported_reason

pytestmark = pytest.mark.fault


def children_of(pid: int) -> dict[int, str]:
    """Living children of ``pid``: pid -> their ``turnlog`` command (worker, projections)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and alive(int(entry.name)):
            try:
                stat = (entry / "stat").read_text()
                args = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                found[int(entry.name)] = args[3].decode()
    return found


def alive(pid: int) -> bool:
    """Running, not gone and not a zombie waiting for a reaper."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


@contextmanager
def split_server(
    settings: Settings, log: Path, *args: str
) -> Iterator[tuple[subprocess.Popen[bytes], str, dict[int, str]]]:
    """``serve --split``, ready, with its two children started: (serve, its URL, children)."""
    with server(settings, log, "--split", *args) as (proc, url):
        children = eventually(lambda: len(c := children_of(proc.pid)) == 2 and c, deadline=30)
        assert sorted(children.values()) == ["projections", "worker"]
        yield proc, url, children


def new_session(url: str) -> str:
    session_id: str = httpx.post(f"{url}/v1/sessions", json={}, timeout=10).json()["session_id"]
    return session_id


def worker_of(children: dict[int, str]) -> int:
    return next(pid for pid, name in children.items() if name == "worker")


def test_the_worker_child_runs_the_turn_and_dies_with_a_killed_serve(
    settings: Settings, tmp_path: Path
) -> None:
    log = tmp_path / "serve.log"
    with split_server(settings, log) as (first, url, children):
        session_id = new_session(url)
        stored = ask(url, session_id, "The codeword is kestrel")
        # The worker child ran it, not serve itself.
        assert stored["worker_id"].split(":")[1] == str(worker_of(children))

        first.send_signal(signal.SIGKILL)
        assert first.wait(timeout=30) == -signal.SIGKILL
        eventually(lambda: not any(alive(pid) for pid in children), deadline=30)

    with server(settings, log, "--split") as (_, url):
        recalled = ask(url, session_id, "What is the codeword?")
    assert recalled["reply"] == "The codeword is kestrel."


def test_sigterm_stops_the_api_then_drains_both_children(
    settings: Settings, tmp_path: Path
) -> None:
    log = tmp_path / "serve.log"
    with split_server(settings, log) as (proc, url, children):
        ask(url, new_session(url), "hello")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
    assert not any(alive(pid) for pid in children)
    output = log.read_text()
    assert output.index("Application shutdown complete") < output.index("worker stopped")
    assert "turnlog.projections: stopped" in output
    assert "Traceback" not in output, output


def test_a_child_that_dies_stops_serve_with_exit_1(settings: Settings, tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with split_server(settings, log) as (proc, _, children):
        worker_pid = worker_of(children)
        os.kill(worker_pid, signal.SIGKILL)
        assert proc.wait(timeout=60) == 1
    assert not any(alive(pid) for pid in children)
    assert f"worker (pid {worker_pid}) was killed by SIGKILL: stopping" in log.read_text()


def test_the_children_serve_metrics_on_the_ports_asked_for(
    settings: Settings, tmp_path: Path
) -> None:
    port = free_port()
    while not port_free(port + 1):
        port = free_port()
    with split_server(settings, tmp_path / "serve.log", "--children-metrics-port", str(port)):
        for metrics_port, name in ((port, "turnlog_worker"), (port + 1, "turnlog_projection")):
            url = f"http://127.0.0.1:{metrics_port}/metrics"
            # Served from the child's start; its own metrics once its part has started.
            eventually(lambda u=url, n=name: n in scrape(u), deadline=30)


def port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def scrape(url: str) -> str:
    try:
        response = httpx.get(url, timeout=2)
    except httpx.TransportError:
        return ""
    return response.text if response.status_code == 200 else ""


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--role", "api", "--split"], "--split splits --role all"),
        (["--children-metrics-port", "9999"], "--children-metrics-port needs --split"),
    ],
    ids=["single-role", "metrics-without-split"],
)
def test_split_options_are_refused_where_they_mean_nothing(
    settings: Settings, args: list[str], says: str
) -> None:
    done = turnlog(settings, "serve", "--port", str(free_port()), *args)

    assert done.returncode == 2
    assert says in done.stderr


def test_a_busy_children_metrics_port_is_refused_before_anything_starts(
    settings: Settings,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        done = turnlog(
            settings,
            "serve",
            "--port",
            str(free_port()),
            "--split",
            "--children-metrics-port",
            str(busy - 1),
        )

    assert done.returncode == 2
    assert f"cannot listen on 127.0.0.1:{busy}" in done.stderr
    assert "--children-metrics-port" in done.stderr


def test_split_is_refused_where_children_would_outlive_serve() -> None:
    assert unsupported_reason("linux") == ""
    assert "needs Linux" in unsupported_reason("darwin")


def test_children_get_the_settings_the_command_line_set(tmp_path: Path) -> None:
    settings = Settings(namespace="elsewhere", data_dir=tmp_path, database_url="postgresql://x/y")

    env = child_env(settings, {"TURNLOG_NAMESPACE": "default", "PATH": "/bin"})

    assert env["TURNLOG_NAMESPACE"] == "elsewhere"
    assert env["TURNLOG_DATA_DIR"] == str(tmp_path.resolve())
    assert env["TURNLOG_DATABASE_URL"] == "postgresql://x/y"
    assert env["PATH"] == "/bin"
