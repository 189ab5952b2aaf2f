"""`turnlog serve` refuses a port it cannot use before it starts anything."""

from __future__ import annotations

import socket
import time

from tests.conftest import turnlog
from tests.deadlines import scaled
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database
from turnlog.application.store.workers_registry import list_workers


def test_a_busy_port_is_refused_before_a_worker_or_runner_starts(
    settings: Settings, database: Database
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        done = turnlog(settings, "serve", "--port", str(port))

    assert done.returncode == 2, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "--port" in done.stderr
    assert time.monotonic() - started < scaled(30)
    assert list_workers(database, settings.namespace) == []  # nothing was started
