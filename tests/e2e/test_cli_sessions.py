"""`turnlog sessions new|send` take what `POST /v1/sessions` and a turn's submit take.

Real `turnlog` processes on a real PostgreSQL; what they wrote is read back
from the stored session.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from tests.conftest import turnlog
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings


def turns_of(runtime: Runtime, sid: UUID) -> list[Any]:
    """The session's turns, oldest first, as stored."""
    _, page, _ = runtime.sessions.turn_page(sid, None, 50)
    return [turn for _, turn in page][::-1]


def test_sessions_new_records_the_approval_policy_and_the_default_deadline(
    settings: Settings, runtime: Runtime
) -> None:
    done = turnlog(settings, "sessions", "new", "--approval-policy", "all", "--deadline", "120")
    assert done.returncode == 0, done.stderr
    session = runtime.sessions.get_session(UUID(done.stdout.strip()))
    assert session.approval_policy == "all"
    assert session.deadline_seconds == 120.0


def test_sessions_new_refuses_a_bad_policy_or_deadline_and_writes_nothing(
    settings: Settings, runtime: Runtime
) -> None:
    for args in (("--approval-policy", "sometimes"), ("--deadline", "0"), ("--deadline", "x")):
        done = turnlog(settings, "sessions", "new", *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
        assert done.stdout == ""
    assert runtime.sessions.session_ids(limit=10) == []


def test_sessions_send_sets_the_turn_deadline(settings: Settings, runtime: Runtime) -> None:
    sid = runtime.sessions.create_session(title="t", provider="fixture", model="m").session_id
    before = datetime.now(UTC)
    done = turnlog(settings, "sessions", "send", str(sid), "hello", "--deadline", "600")
    assert done.returncode == 0, done.stderr
    [turn] = turns_of(runtime, sid)
    assert turn.deadline_at is not None
    assert before + timedelta(seconds=590) < turn.deadline_at < before + timedelta(seconds=700)
    bad = turnlog(settings, "sessions", "send", str(sid), "again", "--deadline", "-1")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    assert len(turns_of(runtime, sid)) == 1


def test_sessions_send_enqueue_queues_behind_a_turn_another_process_runs(
    settings: Settings, runtime: Runtime
) -> None:
    sid = runtime.sessions.create_session(title="t", provider="fixture", model="m").session_id
    lease = runtime.leases.try_acquire(sid)  # this process owns the session: it runs its turns
    assert lease is not None
    with lease:
        first = runtime.sessions.submit_turn(sid, "first")
        refused = turnlog(settings, "sessions", "send", str(sid), "second")
        assert refused.returncode == 3, refused.stderr  # turn in progress
        done = turnlog(settings, "sessions", "send", str(sid), "second", "--enqueue")
        assert done.returncode == 0, done.stderr
        assert "queued" in done.stderr, done.stderr
        turns = turns_of(runtime, sid)
        assert turns[0].turn_id == first.turn_id
        assert [(t.message, str(t.state)) for t in turns] == [
            ("first", "queued"),
            ("second", "queued"),
        ]


def test_sessions_send_shows_the_steps_on_a_terminal_and_nothing_when_piped(
    settings: Settings, runtime: Runtime
) -> None:
    sid = runtime.sessions.create_session(title="t", provider="fixture", model="m").session_id
    echo = '/tool echo {"text": "hi"}'
    shown = turnlog(settings, "sessions", "send", str(sid), echo, "--progress")
    assert shown.returncode == 0, shown.stderr
    steps = [line for line in shown.stderr.splitlines() if line]
    assert steps[0].startswith("model call replied in "), shown.stderr
    assert "tool echo started" in steps and any(
        s.startswith("tool echo succeeded in ") for s in steps
    ), shown.stderr
    piped = turnlog(settings, "sessions", "send", str(sid), echo)
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr
