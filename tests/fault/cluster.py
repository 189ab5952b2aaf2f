"""Real turnlog processes for fault tests: an API, projection runners and workers.

Every wait polls with a deadline; nothing sleeps to wait for something.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psycopg
from psycopg import sql

from tests import deadlines
from tests.conftest import ROOT, raw_events, turnlog_env
from turnlog.application.execution.leases import session_lock_key
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database, advisory_lock_holder

T = TypeVar("T")


def poll(check: Callable[[], T | None], deadline: float = 20.0, what: str = "condition") -> T:
    """Call ``check`` until it returns something truthy, or fail after ``deadline`` seconds
    stretched by the machine's slowness (tests/deadlines.py)."""
    return deadlines.poll(check, deadline, what)


def free_port() -> int:
    """A loopback port free now, for a server that binds it a moment later.

    It is taken below the kernel's range of ephemeral ports: a port from that
    range (what binding port 0 gives) may be handed, before the server binds
    it, to any outgoing connection or to another test's server on port 0, and
    the test would then talk to someone else's server.
    """
    low = _ephemeral_low()
    for _ in range(1000):
        port = random.randrange(max(1024, low - 12_000), low)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port below the ephemeral range")


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


class Process:
    """One turnlog subprocess, its output in a log file."""

    def __init__(self, settings: Settings, name: str, *args: str, **env: str) -> None:
        self.name = name
        self.log_path = Path(settings.data_dir) / f"{name}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "turnlog", *args],
            env=turnlog_env(settings, **env),
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.pid = self.proc.pid

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> int:
        self.signal(signal.SIGKILL)
        return self.wait()

    def wait(self, timeout: float = 60) -> int:
        code = self.proc.wait(timeout=deadlines.scaled(timeout))
        self._log.close()
        return code

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


class Cluster:
    """Processes of one namespace, stopped at the end of a test."""

    def __init__(self, settings: Settings, database: Database) -> None:
        self.settings = settings
        self.database = database
        self.processes: list[Process] = []
        self.api_url = ""

    def start(self, name: str, *args: str, **env: str) -> Process:
        process = Process(self.settings, name, *args, **env)
        self.processes.append(process)
        return process

    def api(self, role: str = "api", port: int = 0, **env: str) -> Process:
        port = port or free_port()
        process = self.start(f"api-{port}", "serve", "--port", str(port), "--role", role, **env)
        self.api_url = f"http://127.0.0.1:{port}"
        poll(lambda: self._ready(process), 60, f"{process.name} ready")
        return process

    def _ready(self, process: Process) -> bool:
        if process.proc.poll() is not None:
            raise AssertionError(f"{process.name} exited:\n{process.output()[-3000:]}")
        try:
            return httpx.get(f"{self.api_url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def projections(self, **env: str) -> Process:
        return self.start("projections", "projections", "run", **env)

    def worker(self, name: str = "worker", *args: str, **env: str) -> Process:
        process = self.start(name, "worker", *args, **env)
        poll(lambda: self.worker_registered(process), 60, f"{name} registered")
        return process

    def worker_registered(self, process: Process) -> bool:
        if process.proc.poll() is not None:
            raise AssertionError(f"{process.name} exited:\n{process.output()[-3000:]}")
        return any(w["pid"] == process.pid for w in self.workers())

    def workers(self) -> list[dict[str, Any]]:
        query = sql.SQL("SELECT worker_id, pid FROM {}.workers").format(
            sql.Identifier(self.settings.schema_name)
        )
        with psycopg.connect(self.database.conninfo, autocommit=True) as conn:
            try:
                rows = conn.execute(query).fetchall()
            except psycopg.errors.UndefinedTable:
                return []
        return [{"worker_id": r[0], "pid": r[1]} for r in rows]

    def stop_all(self) -> None:
        for process in self.processes:
            if process.proc.poll() is None:
                process.kill()

    # ------------------------------------------------------------------ HTTP

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.request(method, f"{self.api_url}{path}", timeout=90, **kwargs)

    def new_session(self) -> str:
        response = self.request("POST", "/v1/sessions", json={"title": "fault"})
        assert response.status_code == 201, response.text
        return str(response.json()["session_id"])

    def submit(self, session_id: str, message: str, wait: float = 0) -> httpx.Response:
        params = {"wait": wait} if wait else {}
        return self.request(
            "POST", f"/v1/sessions/{session_id}/turns", params=params, json={"message": message}
        )

    def turn(self, session_id: str, turn_id: str) -> dict[str, Any]:
        response = self.request("GET", f"/v1/sessions/{session_id}/turns/{turn_id}")
        assert response.status_code == 200, response.text
        return dict(response.json())

    # ---------------------------------------------------------------- record

    def topics(self, session_id: str) -> list[str]:
        rows = raw_events(self.database, self.settings.namespace, session_id)
        return [r[3].split(".")[2] for r in rows]

    def lease_backend(self, session_id: str) -> int | None:
        """The server pid of the connection holding the session's lease."""
        key = session_lock_key(self.settings.namespace, session_id)
        with psycopg.connect(self.database.conninfo, autocommit=True) as conn:
            holder = advisory_lock_holder(conn, key)
        return holder.pid if holder else None

    def terminate_backend(self, pid: int) -> None:
        with psycopg.connect(self.database.conninfo, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


@contextmanager
def shared_namespace(database: Database, data_dir: Path) -> Iterator[Settings]:
    """Settings of a fresh namespace for a module's tests to share; dropped afterwards."""
    from tests.conftest import drop_namespace

    name = f"t_{uuid.uuid4().hex[:12]}"
    try:
        yield Settings(
            database_url=database.conninfo,
            namespace=name,
            data_dir=data_dir,
            snapshot_interval=50,
            probes=False,  # as the settings fixture: on where a test asks
        )
    finally:
        drop_namespace(database, name)


@contextmanager
def cluster(settings: Settings, database: Database) -> Iterator[Cluster]:
    c = Cluster(settings, database)
    try:
        yield c
    finally:
        c.stop_all()


def worker_pid(worker_id: str) -> int:
    """Worker ids are host:pid:random."""
    return int(worker_id.split(":")[1])
