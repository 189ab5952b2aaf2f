"""Lease connections: kept between leases, as many as a process may hold at once."""

from __future__ import annotations

from uuid import uuid4

from turnlog.application.settings import Settings
from turnlog.interface.bootstrap import build_process
from turnlog.interface.roles import Role


def test_a_worker_keeps_a_lease_connection_for_each_turn_it_may_run_at_once(
    settings: Settings,
) -> None:
    process = build_process(settings, Role.WORKER, worker_concurrency=16).start()
    try:
        runtime = process.runtime
        assert runtime is not None
        leases = [runtime.leases.try_acquire(uuid4()) for _ in range(16)]
        opened = runtime.leases.opened
        for lease in leases:
            assert lease is not None
            lease.release()

        again = [runtime.leases.try_acquire(uuid4()) for _ in range(16)]  # none opened

        assert runtime.leases.opened == opened
        for lease in again:
            assert lease is not None
            lease.release()
    finally:
        process.stop(drain_timeout=5)
