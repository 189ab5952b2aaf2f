"""Searching sessions in the sessions read model: ?q= and ?metadata.KEY=VALUE, paged.

Sessions are created through the API with the projection runners in this
process; every read waits for the read model to reach the last write.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi.testclient import TestClient

from tests.api.conftest import caught_up, problem
from tests.conftest import turnlog
from turnlog.application.settings import Settings


def _create(client: TestClient, title: str, metadata: dict[str, Any]) -> dict[str, Any]:
    answer = client.post("/v1/sessions", json={"title": title, "metadata": metadata})
    assert answer.status_code == 201, answer.text
    body: dict[str, Any] = answer.json()
    return body


def _list(client: TestClient, position: int, **params: Any) -> list[dict[str, Any]]:
    """Every page of the list with these filters (pages of 2), waiting for ``position``."""
    found: list[dict[str, Any]] = []
    cursor = None
    while True:
        query = {**params, "limit": 2, "min_position": position}
        if cursor:
            query["cursor"] = cursor
        answer = caught_up(lambda q=query: client.get("/v1/sessions", params=q))
        assert answer.status_code == 200, answer.text
        page = answer.json()
        assert len(page["items"]) <= 2
        found += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            return found


def test_search_by_title_or_id_prefix_and_by_metadata_pages_with_the_lists_cursors(
    full: TestClient, settings: Settings
) -> None:
    made = [
        _create(full, "Billing dispute", {"team": "support", "tier": 2}),
        _create(full, "billing question", {"team": "support", "tier": "2"}),
        _create(full, "Refund billing", {"team": "sales", "vip": True}),
        _create(full, "Billing, again", {"team": "sales"}),
        _create(full, "100% off", {"team": "support", "tier": 3}),
        _create(full, "untitled", {}),
    ]
    last = max(m["position"] for m in made)
    ids = [m["session_id"] for m in made]

    def titles(**params: Any) -> list[str]:
        return [row["title"] for row in _list(full, last, **params)]

    # Newest activity first, title prefix case-insensitive, never a match inside a title.
    assert titles(q="billing") == ["Billing, again", "billing question", "Billing dispute"]
    assert titles(q="BILLING D") == ["Billing dispute"]
    assert titles(q="100%") == ["100% off"]  # LIKE wildcards are literal
    assert titles(q="1_0") == []
    # An id prefix, in either case.
    assert [r["session_id"] for r in _list(full, last, q=ids[2][:13].upper())] == [ids[2]]
    # Metadata: every filter must hold; "2" matches the number 2 and the text "2".
    assert titles(**{"metadata.team": "support"}) == [
        "100% off",
        "billing question",
        "Billing dispute",
    ]
    assert titles(**{"metadata.team": "support", "metadata.tier": "2"}) == [
        "billing question",
        "Billing dispute",
    ]
    assert titles(**{"metadata.vip": "true"}) == ["Refund billing"]
    assert titles(q="billing", **{"metadata.team": "sales"}) == ["Billing, again"]
    assert titles(**{"metadata.team": "nobody"}) == []
    rows = _list(full, last, q="Refund")
    assert rows[0]["metadata"] == {"team": "sales", "vip": True}

    # Bad input: a search over 200 characters, a bare prefix, an unknown parameter.
    problem(full.get("/v1/sessions", params={"q": "x" * 201}), 422, "validation_error")
    assert full.get("/v1/sessions", params={"q": "x" * 200}).status_code == 200
    problem(full.get("/v1/sessions", params={"metadata.": "x"}), 422, "validation_error")
    problem(full.get("/v1/sessions", params={"metadatas.team": "x"}), 422, "validation_error")
    long_key = {f"metadata.{'k' * 201}": "x"}
    problem(full.get("/v1/sessions", params=long_key), 422, "invalid_query")
    problem(full.get("/v1/sessions", params={"q": "a\x00b"}), 422, "invalid_query")
    problem(full.get("/v1/sessions", params={"metadata.team": "a\x00"}), 422, "invalid_query")
    problem(full.get("/v1/sessions", params={"metadata.t\x00": "a"}), 422, "invalid_query")
    nan = full.get("/v1/sessions", params={"metadata.tier": "NaN", "q": "1e400"})
    assert nan.status_code == 200 and nan.json()["items"] == []  # texts, not numbers

    # A fork lists with the turns it carries.
    sid = ids[0]
    sent = full.post(f"/v1/sessions/{sid}/turns", params={"wait": 30}, json={"message": "hi"})
    assert sent.status_code in (200, 202), sent.text
    version = caught_up(lambda: full.get(f"/v1/sessions/{sid}")).json()["version"]
    forked = full.post(
        f"/v1/sessions/{sid}/fork", json={"version": version, "title": "Billing fork"}
    )
    assert forked.status_code == 201, forked.text
    [row] = _list(full, forked.json()["position"], q="billing fork")
    assert (row["turn_count"], row["last_turn_state"]) == (1, "completed")
    assert row["metadata"] == {"team": "support", "tier": 2}

    # The command line reads the same read model.
    cli = turnlog(settings, "sessions", "list", "--search", "billing", "--limit", "2", "--json")
    assert cli.returncode == 0, cli.stderr
    page = json.loads(cli.stdout)
    # Its turn moved "Billing dispute" up: activity orders the list.
    assert [r["title"] for r in page["items"]] == ["Billing fork", "Billing dispute"]
    assert page["next_cursor"]
    cli = turnlog(
        settings, "sessions", "list", "--search", "billing", "--cursor", page["next_cursor"],
        "--metadata", "team=support", "--json",
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    assert [r["title"] for r in json.loads(cli.stdout)["items"]] == ["billing question"]
    bad = turnlog(settings, "sessions", "list", "--metadata", "no-equals-sign")
    assert bad.returncode == 2, bad.stdout + bad.stderr
    bad = turnlog(settings, "sessions", "list", "--search", "x" * 201)
    assert bad.returncode == 2, bad.stdout + bad.stderr
