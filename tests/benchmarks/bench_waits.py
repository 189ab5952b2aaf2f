"""Figure 11: a writer's rate while 600 clients wait on ``?wait=`` for other sessions.

One API (no worker, so the submitted turns stay queued and their waiters keep
waiting) serves a client that creates sessions one after another; its rate with
600 waiters open is set against its rate from the same server before they
came. 600 waiters used to cut that rate 14-fold: every commit woke every waiter
and each rebuilt its session. ``tests/fault/test_waits.py`` asserts the cause
(the writer's commits wake none of them); this figure measures what it costs.
"""

from __future__ import annotations

import dataclasses
import time

import httpx

from tests.api.conftest import FAST, live_server
from tests.benchmarks.bench_throughput import Config
from tests.benchmarks.suite import Figure, Row, Stat, fmt, scratch_namespace
from tests.fault.cluster import poll
from tests.fault.waiters import wait_in_background
from turnlog.application.store.database import Database
from turnlog.interface.bootstrap import build_runtime
from turnlog.interface.http import create_app

WAITERS = 600
SESSIONS = 30  # 20 waiters per queued turn, joined through its Idempotency-Key


def creation_rate(url: str, creates: int) -> float:
    """Sessions created per second by one client, one request after another."""
    with httpx.Client(base_url=url, timeout=60) as client:
        started = time.perf_counter()
        for _ in range(creates):
            client.post("/v1/sessions", json={}).raise_for_status()
        return creates / (time.perf_counter() - started)


def figure_11(db: Database, cfg: Config) -> Figure:
    creates = cfg.pick(50, 15)
    with scratch_namespace(db) as settings:
        build_runtime(settings).close()  # the namespace's tables
        app = create_app(
            settings, role="api", options=dataclasses.replace(FAST, max_waits=WAITERS + 10)
        )
        state = app.state.turnlog
        with live_server(app) as url:
            with httpx.Client(base_url=url, timeout=30) as client:
                sessions = [
                    client.post("/v1/sessions", json={}).json()["session_id"]
                    for _ in range(SESSIONS)
                ]
            creation_rate(url, 5)  # warm-up
            alone = [creation_rate(url, creates) for _ in range(cfg.repeat)]
            waiting = wait_in_background(url, sessions, WAITERS)
            poll(lambda: state.waits.watching >= WAITERS, 300, f"{WAITERS} waiters")
            poll(lambda: state.waits.followed == SESSIONS, 60, "every session followed")
            creation_rate(url, 5)  # the first look at each session woke its waiters
            woken_before = state.waits.woken
            loaded = [creation_rate(url, creates) for _ in range(cfg.repeat)]
            woken = state.waits.woken - woken_before
            still = state.waits.open
            state.draining.set()  # release the waiters, as a shutdown does
            waiting.join(60)
    with_waiters = Stat(loaded, "creations/s")
    without = Stat(alone, "creations/s")
    ratio = without.median / with_waiters.median  # > 1: slower with the waiters
    return Figure(
        11,
        f"session creations/s with {WAITERS} waiters on ?wait, vs none",
        [
            Row(
                "11",
                f"time per session creation with {WAITERS} open waits (vs none, same server)",
                with_waiters,
                without,
                ratio,
                "≤ 2.0x",
                ratio <= 2.0 and still >= WAITERS,
            )
        ],
        how=(
            "One API process (`create_app(role='api')` under uvicorn, no worker: submitted"
            f" turns stay queued) with the wait bound raised to {WAITERS + 10}. {SESSIONS}"
            f" sessions each get a queued turn that {WAITERS // SESSIONS} clients wait on"
            f" (`?wait=60`, one Idempotency-Key per session). One client creates {creates}"
            f" sessions one after another, {cfg.repeat} times before the waiters come and"
            f" {cfg.repeat} times while all {WAITERS} wait; the figure is the ratio of the"
            " medians (time per creation with the waiters over without: 1.0 = no cost)."
            f" The writer's {creates * cfg.repeat} commits woke {woken} waiters; {still} were"
            f" still open at the end. The waiters' client runs in the same process as the"
            " server, so the ratio includes their share of the CPU."
            f" Medians {fmt(with_waiters.median)} vs {fmt(without.median)} creations/s."
        ),
        details={"woken_by_the_writer": woken, "open_at_the_end": still},
    )
