"""A purge and the rest of the system: sandboxes left on other hosts, racing purges, late rows."""

from __future__ import annotations

import json
import threading
from uuid import UUID

import pytest

from tests.purge_support import needles_of, purge_record, traces
from turnlog.application.errors import PurgeRefused, SessionPurged
from turnlog.application.purge_watch import PurgeWatch
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database
from turnlog.application.tools.sandboxes import Sandboxes
from turnlog.interface.bootstrap import build_runtime
from turnlog.interface.purging import build_purger
from turnlog.projections import ReadModels


@pytest.fixture
def reads(runtime: Runtime, settings: Settings) -> ReadModels:
    return ReadModels(runtime.db, settings, sessions=runtime.sessions)


def _with_sandbox(runtime: Runtime) -> UUID:
    sid = runtime.sessions.create_session(title="sandboxed").session_id
    args = json.dumps({"path": "f.txt", "text": "x"})
    runtime.send(sid, f"/tool append_file {args}")
    return sid


def test_gc_removes_the_sandbox_of_a_session_purged_elsewhere(
    runtime: Runtime, reads: ReadModels, settings: Settings
) -> None:
    sid = _with_sandbox(runtime)
    build_purger(runtime, reads).purge(sid, "erasure", "dpo")
    # What another host's sandbox of the session looks like after the purge.
    left = settings.sandbox_root / str(sid)
    left.mkdir(parents=True)
    (left / "f.txt").write_text("x")
    sandboxes = Sandboxes(runtime.sessions, settings.sandbox_root)

    assert [s.status for s in sandboxes.scan()] == ["purged"]
    planned = sandboxes.gc(dry_run=True)
    assert [(a.action, a.reason) for a in planned] == [("would remove", "the session is purged")]
    assert left.exists()
    done = sandboxes.gc()

    assert [(a.action, a.reason) for a in done] == [("removed", "the session is purged")]
    assert not left.exists()


def test_two_purges_of_one_session_at_once_purge_it_once(
    runtime: Runtime, reads: ReadModels, database: Database, namespace: str
) -> None:
    sid = _with_sandbox(runtime)
    # The first purge waits after its intent while the second one is asked.
    reached, go_on = threading.Event(), threading.Event()

    def pause(step: str) -> None:
        if step == "intent":
            reached.set()
            assert go_on.wait(60)

    first = build_purger(runtime, reads)
    first.pause = pause
    results: list[object] = []
    thread = threading.Thread(target=lambda: results.append(first.purge(sid, "a", "one")))
    thread.start()
    assert reached.wait(60)

    with pytest.raises(PurgeRefused):
        build_purger(runtime, reads).purge(sid, "b", "two")
    go_on.set()
    thread.join(60)

    assert len(results) == 1
    record = purge_record(database, namespace, str(sid))
    assert record is not None and record["state"] == "done" and record["actor"] == "one"
    with pytest.raises(SessionPurged):
        build_purger(runtime, reads).purge(sid, "b", "two")


def test_a_late_writer_cannot_store_after_the_drop(
    runtime: Runtime, reads: ReadModels, database: Database, namespace: str
) -> None:
    sid = _with_sandbox(runtime)
    purger = build_purger(runtime, reads)
    recorder = runtime.sessions.recorder
    refused: list[str] = []

    def late_write(step: str) -> None:
        if step == "dropped":
            # A save that read the session before its close and stores after the drop:
            # the version before it is gone, so the insert stores nothing.
            from eventsourcing.persistence import IntegrityError, StoredEvent

            stored = StoredEvent(sid, 99, "turnlog.late#1", b'{"late": "sandboxed"}')
            with pytest.raises(IntegrityError, match="version 98 is missing") as refusal:
                recorder.insert_events([stored])
            refused.append(str(refusal.value))

    purger.pause = late_write

    purger.purge(sid, "erasure", "dpo")

    assert refused
    assert traces(database, namespace, needles_of(sid, "sandboxed"), ["purges"]) == {}


def test_a_process_that_missed_the_notification_forgets_the_session_at_its_next_look(
    runtime: Runtime, reads: ReadModels, settings: Settings
) -> None:
    sid = _with_sandbox(runtime)
    other = build_runtime(settings)  # another process's runtime: no follower, no news
    try:
        assert other.sessions.get_session(sid).title == "sandboxed"  # now in its cache
        watch = PurgeWatch(other.sessions, other.db)
        assert watch.look() == []

        build_purger(runtime, reads).purge(sid, "erasure", "dpo")

        # Its cache still answers (the fast-forward finds no new event)...
        assert other.sessions.get_session(sid).title == "sandboxed"
        assert watch.look() == [str(sid)]
        # ...until the watch has looked: then it reads the store, and the session is gone.
        with pytest.raises(SessionPurged):
            other.sessions.get_session(sid)
        assert watch.look() == []
    finally:
        other.close()
