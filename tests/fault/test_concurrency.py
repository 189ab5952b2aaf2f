"""Races between processes: submits to one session, operator actions on one turn.

Two API processes serve one namespace; clients fire at both at the same
instant (a barrier). For each slot exactly one request wins and every other
gets a 409; the stream's versions stay contiguous and nothing acknowledged
is lost.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import raw_events
from tests.fault.cluster import Cluster, cluster, poll, shared_namespace
from tests.fault.record import Record, check
from turnlog.application.store.database import Database

pytestmark = pytest.mark.fault

RACERS = 6


@pytest.fixture(scope="module")
def two_apis(
    database: Database, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Cluster, list[str]]]:
    """Two API processes and a projection runner; no worker, so turns stay where we put them.

    Shared by the module's tests (each works on sessions of its own).
    """
    with (
        shared_namespace(database, tmp_path_factory.mktemp("races")) as settings,
        cluster(settings, database) as c,
    ):
        urls = []
        for _ in range(2):
            c.api("api")
            urls.append(c.api_url)
        c.projections()
        yield c, urls


def race(calls: list[Callable[[], httpx.Response]]) -> list[httpx.Response]:
    """Run every call at the same instant, each on its own thread."""
    barrier = threading.Barrier(len(calls))
    answers: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait()
        answers[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return answers


def statuses(answers: list[httpx.Response]) -> Counter[int]:
    return Counter(a.status_code for a in answers)


def versions_contiguous(c: Cluster, session_id: str) -> bool:
    versions = [r[2] for r in raw_events(c.database, c.settings.namespace, session_id)]
    return versions == list(range(1, len(versions) + 1))


def test_racing_submits_to_one_session_from_two_api_processes_admit_exactly_one(
    two_apis: tuple[Cluster, list[str]],
) -> None:
    c, urls = two_apis
    sid = httpx.post(f"{urls[0]}/v1/sessions", json={}).json()["session_id"]
    acknowledged = []
    for round_ in range(3):
        answers = race(
            [
                lambda i=i, r=round_: httpx.post(
                    f"{urls[i % 2]}/v1/sessions/{sid}/turns",
                    json={"message": f"round {r} racer {i}"},
                    timeout=30,
                )
                for i in range(RACERS)
            ]
        )
        assert statuses(answers) == {202: 1, 409: RACERS - 1}, [a.text for a in answers]
        assert {a.json()["code"] for a in answers if a.status_code == 409} == {"turn_in_progress"}
        winner = next(a.json() for a in answers if a.status_code == 202)
        acknowledged.append(winner["turn_id"])
        _finish_by_hand(c, sid, winner["turn_id"])
    assert versions_contiguous(c, sid)
    _no_loss(c, acknowledged)


def _finish_by_hand(c: Cluster, session_id: str, turn_id: str) -> None:
    """Complete the queued turn the way a worker would, in this process."""
    from uuid import UUID

    from turnlog.interface.bootstrap import build_runtime

    runtime = build_runtime(c.settings)
    try:
        runtime.continue_session(UUID(session_id))
    finally:
        runtime.close()
    turn = httpx.get(f"{c.api_url}/v1/sessions/{session_id}/turns/{turn_id}").json()
    assert turn["state"] == "completed", turn


def _no_loss(c: Cluster, acknowledged: list[str]) -> None:
    record = Record(c.settings, c.database)
    try:
        findings = check(record.refresh(), acknowledged)
    finally:
        record.close()
    assert findings.ok, findings


def test_racing_submits_with_one_idempotency_key_make_one_turn(
    two_apis: tuple[Cluster, list[str]],
) -> None:
    c, urls = two_apis
    sid = httpx.post(f"{urls[0]}/v1/sessions", json={}).json()["session_id"]
    answers = race(
        [
            lambda i=i: httpx.post(
                f"{urls[i % 2]}/v1/sessions/{sid}/turns",
                json={"message": "once"},
                headers={"Idempotency-Key": "the-one"},
                timeout=30,
            )
            for i in range(RACERS)
        ]
    )
    assert statuses(answers) == {202: RACERS}, [a.text for a in answers]
    assert len({a.json()["turn_id"] for a in answers}) == 1
    replayed = [a.headers.get("idempotent-replayed") for a in answers]
    assert replayed.count("true") == RACERS - 1
    topics = [r[3].split(".")[2] for r in raw_events(c.database, c.settings.namespace, sid)]
    assert topics.count("TurnSubmitted") == 1
    assert versions_contiguous(c, sid)


def _interrupted(c: Cluster, url: str) -> tuple[str, str, str]:
    """A session whose turn is interrupted with one unknown call: (session, turn, call)."""
    from uuid import UUID

    from tests.api.conftest import interrupt_a_turn
    from turnlog.interface.bootstrap import build_runtime

    sid = httpx.post(f"{url}/v1/sessions", json={}).json()["session_id"]
    runtime = build_runtime(c.settings)
    try:
        turn_id, call_id = interrupt_a_turn(runtime, sid)
    finally:
        runtime.close()
    assert UUID(sid)
    return sid, turn_id, call_id


@pytest.mark.parametrize("contest", ["abandon", "resolve", "abandon or resolve"])
def test_racing_operators_on_one_interrupted_turn_exactly_one_wins(
    two_apis: tuple[Cluster, list[str]], contest: str
) -> None:
    c, urls = two_apis
    sid, turn_id, call_id = _interrupted(c, urls[0])

    def abandon(i: int) -> httpx.Response:
        return httpx.post(
            f"{urls[i % 2]}/v1/sessions/{sid}/turns/{turn_id}/abandon",
            json={"reason": f"operator {i}", "actor": f"op{i}"},
            timeout=30,
        )

    def resolve(i: int) -> httpx.Response:
        return httpx.post(
            f"{urls[i % 2]}/v1/sessions/{sid}/tool-calls/{call_id}/resolve",
            json={
                "outcome": "succeeded",
                "result": {"by": i},
                "note": "checked",
                "actor": f"op{i}",
            },
            timeout=30,
        )

    pick = {
        "abandon": lambda i: abandon(i),
        "resolve": lambda i: resolve(i),
        "abandon or resolve": lambda i: abandon(i) if i % 2 else resolve(i),
    }[contest]
    answers = race([lambda i=i: pick(i) for i in range(RACERS)])
    assert statuses(answers) == {200: 1, 409: RACERS - 1}, [a.text for a in answers]
    topics = [r[3].split(".")[2] for r in raw_events(c.database, c.settings.namespace, sid)]
    assert topics.count("TurnAbandoned") + topics.count("ToolCallResolved") == 1
    assert versions_contiguous(c, sid)
    poll(lambda: httpx.get(f"{c.api_url}/v1/sessions/{sid}").status_code == 200, 10, "readable")
