"""Sandbox collection without processes: what is removed, what is left alone."""

from __future__ import annotations

from turnlog.application.runtime import Runtime
from turnlog.application.tools.sandboxes import Sandboxes


def test_gc_removes_only_sandboxes_of_closed_sessions_and_never_unknown_directories(
    runtime: Runtime,
) -> None:
    root = runtime.settings.sandbox_root
    closed = runtime.sessions.create_session().session_id
    idle = runtime.sessions.create_session().session_id
    for session_id in (closed, idle):
        runtime.send(session_id, '/tool append_file {"path": "notes/a.txt", "text": "x"}')
    runtime.sessions.close_session(closed, "finished", "ops")
    stranger = root / "not-a-session"
    stranger.mkdir()
    sandboxes = Sandboxes(runtime.sessions, root)

    listed = {s.session_id: s for s in sandboxes.scan()}
    assert listed[str(closed)].status == "closed" and listed[str(idle)].status == "idle"
    assert listed[str(idle)].size_bytes == 2 and listed[str(idle)].processes == []
    assert listed["not-a-session"].status == "no such session"

    dry = [(a.session_id, a.action) for a in sandboxes.gc(dry_run=True)]
    assert sorted(dry) == sorted([(str(closed), "would remove"), ("not-a-session", "left")])
    assert (root / str(closed)).is_dir()

    done = [(a.session_id, a.action) for a in sandboxes.gc()]
    assert sorted(done) == sorted([(str(closed), "removed"), ("not-a-session", "left")])
    assert not (root / str(closed)).exists()
    assert (root / str(idle) / "notes" / "a.txt").read_text() == "x\n"
    assert stranger.is_dir()
