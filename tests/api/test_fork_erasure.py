"""Erasing a session that was forked: its forks hold copies of its turns, and are found.

A fork carries its source's conversation up to the fork's version (its first
event) and names the source, so a purge of the source does not reach it: the
source's forks are listed by ``?forked_from=`` (the sessions read model keeps
each fork's source, also once the source is purged), and purging them too
leaves no trace of the source in any table.
"""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.api.conftest import caught_up, problem
from tests.api.test_purge_api import (  # noqa: F401  (fixtures)
    PURGE,
    SECRET,
    TITLE,
    _session_with_history,
    kept,
    settings,
)
from tests.conftest import turnlog
from tests.purge_support import needles_of, traces
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database


def _fork(client: TestClient, sid: str) -> dict[str, Any]:
    version = client.get(f"/v1/sessions/{sid}").json()["version"]
    answer = client.post(f"/v1/sessions/{sid}/fork", json={"version": version})
    assert answer.status_code == 201, answer.text
    body: dict[str, Any] = answer.json()
    return body


def _forks_of(client: TestClient, sid: str, position: int) -> list[str]:
    query = {"forked_from": sid, "min_position": position}
    answer = caught_up(lambda: client.get("/v1/sessions", params=query))
    assert answer.status_code == 200, answer.text
    rows = answer.json()["items"]
    assert all(row["forked_from"] == sid for row in rows)
    return [row["session_id"] for row in rows]


def test_the_forks_of_a_purged_session_are_found_and_purging_them_leaves_no_trace(
    kept: TestClient,  # noqa: F811
    settings: Settings,  # noqa: F811
    database: Database,
    namespace: str,
) -> None:
    sid, turns = _session_with_history(kept, settings)
    child = _fork(kept, sid)
    grandchild = _fork(kept, child["session_id"])
    unrelated = _fork(kept, kept.post("/v1/sessions", json={}).json()["session_id"])
    assert _forks_of(kept, sid, unrelated["position"]) == [child["session_id"]]
    assert _forks_of(kept, child["session_id"], 0) == [grandchild["session_id"]]
    listed = turnlog(settings, "sessions", "list", "--forked-from", sid, "--json")
    assert listed.returncode == 0, listed.stderr
    assert child["session_id"] in listed.stdout and grandchild["session_id"] not in listed.stdout

    purged = kept.post(f"/v1/sessions/{sid}/purge", json=PURGE)
    assert purged.status_code == 200, purged.text
    needles = needles_of(sid, TITLE, SECRET, *turns)
    # The forks still hold the source's words: only in their own rows.
    left = traces(database, namespace, needles, skip=["purges"])
    assert set(left) == {"sessions_events", "sessions_view"}, left
    assert kept.get(f"/v1/sessions/{child['session_id']}").status_code == 200
    # Still found by the purged source's id, so the erasure can go on.
    forks = _forks_of(kept, sid, kept.post("/v1/sessions", json={}).json()["position"])
    assert forks == [child["session_id"]]
    for fork in (grandchild["session_id"], *forks):
        assert kept.post(f"/v1/sessions/{fork}/purge", json=PURGE).status_code == 200

    assert traces(database, namespace, needles, skip=["purges"]) == {}
    problem(kept.get("/v1/sessions", params={"forked_from": "not-an-id"}), 422, "validation_error")
