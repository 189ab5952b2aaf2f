"""Retention: closed sessions older than the period are purged, one process at a time.

"Older" is judged at a ``now`` the test chooses: the sessions are made now,
and the run looks at them from 31 days on, with a 30-day period.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from uuid import UUID

import pytest

from tests.purge_support import needles_of, purge_record, traces
from turnlog.application.retention import Due, RetentionJob
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database
from turnlog.interface.metrics import RetentionCollector
from turnlog.interface.purging import build_retention
from turnlog.projections import ReadModels, read_models
from turnlog.projections.purging import reads_settler
from turnlog.projections.rebuild import verify

LATER = datetime.now(UTC) + timedelta(days=31)


@pytest.fixture
def reads(runtime: Runtime, settings: Settings) -> ReadModels:
    return ReadModels(runtime.db, settings, sessions=runtime.sessions)


def _current(reads: ReadModels) -> None:
    """Every read model at the log's head (folded here: no runner runs in these tests)."""
    assert reads_settler(reads)(reads.events.head_place())


def _sessions(runtime: Runtime) -> dict[str, UUID]:
    s = runtime.sessions
    made = {name: s.create_session(title=f"retention-{name}").session_id for name in "abcd"}
    for name in ("a", "b", "c"):
        runtime.send(made[name], f"hello from {name}")
    for name in ("a", "b"):
        s.close_session(made[name], "done", "ops")
    # c has turns but stays open; d is open and empty.
    return made


def test_a_dry_run_lists_the_closed_sessions_past_the_period_and_changes_nothing(
    runtime: Runtime, reads: ReadModels
) -> None:
    made = _sessions(runtime)
    _current(reads)
    retention = build_retention(runtime, reads, days=30)

    listed = retention.run(dry_run=True, now=LATER)

    assert {d.session_id for d in listed} == {made["a"], made["b"]}
    assert all(d.events is None and not d.error for d in listed)
    assert retention.run(dry_run=True) == []  # seen from today, nothing is 30 days old
    for sid in made.values():
        runtime.sessions.get_session(sid)  # all still there


def test_a_run_purges_only_the_closed_sessions_past_the_period_with_progress(
    runtime: Runtime, reads: ReadModels, database: Database, namespace: str
) -> None:
    made = _sessions(runtime)
    _current(reads)
    seen: list[tuple[Due, int, int]] = []

    done = build_retention(runtime, reads, days=30).run(
        progress=lambda d, i, n: seen.append((d, i, n)), now=LATER
    )

    assert {d.session_id for d in done} == {made["a"], made["b"]}
    assert [(i, n) for _, i, n in seen] == [(1, 2), (2, 2)]
    assert all(d.events and not d.error for d in done)
    for name in ("a", "b"):
        record = purge_record(database, namespace, str(made[name]))
        assert record is not None and record["state"] == "done"
        assert record["actor"] == "retention" and "30 days" in record["reason"]
        found = traces(database, namespace, needles_of(made[name], f"retention-{name}"), ["purges"])
        assert found == {}
    for name in ("c", "d"):
        assert runtime.sessions.get_session(made[name]).title == f"retention-{name}"
    _current(reads)
    assert all(v.ok for v in verify(reads.events, read_models())), "read models disagree"


def test_a_session_closed_but_active_after_the_cutoff_is_not_purged_by_a_lagging_read_model(
    runtime: Runtime, reads: ReadModels
) -> None:
    made = _sessions(runtime)
    _current(reads)
    # Closed, then looked at from only 29 days on: not due, whatever the read model said.
    retention = build_retention(runtime, reads, days=30)
    soon = datetime.now(UTC) + timedelta(days=29)
    assert retention.run(now=soon) == []
    assert runtime.sessions.get_session(made["a"]).closed


@pytest.fixture
def jobs(runtime: Runtime, reads: ReadModels) -> Iterator[list[RetentionJob]]:
    made: list[RetentionJob] = []
    yield made
    for job in made:
        job.stop()


def test_only_the_job_holding_the_lock_runs_and_another_takes_over_when_it_stops(
    runtime: Runtime, reads: ReadModels, settings: Settings, jobs: list[RetentionJob]
) -> None:
    retention = build_retention(runtime, reads, days=30)
    for _ in range(2):
        jobs.append(RetentionJob(retention, runtime.db, settings.namespace, interval=3600))
    first, second = jobs

    assert first._lead() and first.stats.leading
    assert not second._lead() and not second.stats.leading
    first.stop()
    assert second._lead() and second.stats.leading


def test_the_job_counts_what_it_purged_in_its_metrics(
    runtime: Runtime, reads: ReadModels, settings: Settings, jobs: list[RetentionJob]
) -> None:
    made = _sessions(runtime)
    _current(reads)
    retention = build_retention(runtime, reads, days=30)
    job = RetentionJob(retention, runtime.db, settings.namespace, interval=3600)
    jobs.append(job)
    original = retention.run
    retention.run = lambda **kw: original(now=LATER, **kw)  # type: ignore[method-assign]

    done = job.run_once()

    assert {d.session_id for d in done} == {made["a"], made["b"]}
    metrics = {m.name: m.samples[0].value for m in RetentionCollector(job.stats).collect()}
    assert metrics["turnlog_retention_purged_sessions"] == 2
    assert metrics["turnlog_retention_purged_events"] == sum(d.events or 0 for d in done) > 0
    assert metrics["turnlog_retention_runs"] == 1 and metrics["turnlog_retention_failed_runs"] == 0
    assert metrics["turnlog_retention_last_run_timestamp_seconds"] > 0
