"""``turnlog sessions purge`` and ``turnlog retention run`` refusals, as real processes."""

from __future__ import annotations

import json
from uuid import uuid4

from tests.conftest import turnlog
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings

WHY = ("--reason", "erasure", "--actor", "dpo")


def test_a_purge_names_its_refusals_by_exit_code(runtime: Runtime, settings: Settings) -> None:
    busy = runtime.sessions.create_session(title="busy").session_id
    runtime.sessions.submit_turn(busy, "still queued")

    assert turnlog(settings, "sessions", "purge", str(uuid4()), *WHY).returncode == 4
    assert turnlog(settings, "sessions", "purge", "not-an-id", *WHY).returncode == 4
    missing = turnlog(settings, "sessions", "purge", str(busy), "--actor", "dpo")
    assert missing.returncode == 2 and "--reason" in missing.stderr
    blank = turnlog(settings, "sessions", "purge", str(busy), "--reason", " ", "--actor", "dpo")
    assert blank.returncode == 2 and "reason" in blank.stderr
    refused = turnlog(settings, "sessions", "purge", str(busy), *WHY)
    assert refused.returncode == 3 and "turn" in refused.stderr
    assert runtime.sessions.get_session(busy).status == "busy"


def test_a_purge_prints_its_record_as_json(runtime: Runtime, settings: Settings) -> None:
    sid = runtime.sessions.create_session(title="gone").session_id

    done = turnlog(settings, "sessions", "purge", str(sid), *WHY, "--json")

    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["session_id"] == str(sid) and record["state"] == "done"
    assert record["events"] == 2 and record["actor"] == "dpo"


def test_retention_needs_a_period_and_a_dry_run_changes_nothing(
    runtime: Runtime, settings: Settings
) -> None:
    sid = runtime.sessions.create_session(title="recent").session_id
    runtime.sessions.close_session(sid, "done", "ops")

    none = turnlog(settings, "retention", "run", "--dry-run")
    assert none.returncode == 2 and "TURNLOG_RETENTION_DAYS" in none.stderr
    listed = turnlog(settings, "retention", "run", "--dry-run", "--days", "30")
    assert listed.returncode == 0, listed.stderr
    assert "0 session(s) would be purged" in listed.stdout
    ran = turnlog(settings, "retention", "run", "--days", "30", "--json")
    assert ran.returncode == 0 and json.loads(ran.stdout) == []
    assert runtime.sessions.get_session(sid).closed
