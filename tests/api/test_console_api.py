"""The console over HTTP: page shells carry no data, fragments need the token, and the
summaries the status board reads (/v1/open-turns/summary, /v1/tool-calls/activity)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from tests.api.conftest import (
    CATCHING_UP,
    interrupt_a_turn,
    new_session,
    problem,
    run_queued_turn,
)
from turnlog.application.runtime import Runtime
from turnlog.application.settings import Settings
from turnlog.interface.http import create_app
from turnlog.projections import ProjectionSupervisor

TOKEN = "tok-console-7d1e"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TITLE = "Quarterly payroll run 4411"


@pytest.fixture
def reads(settings: Settings, runtime: Runtime) -> Iterator[TestClient]:
    """The API with projection runners and no worker: turns stay where a test leaves them."""
    app = create_app(settings, role="api", options=CATCHING_UP)
    with (
        ProjectionSupervisor(settings, runtime.db, sessions=runtime.sessions, poll_interval=0.1),
        TestClient(app, raise_server_exceptions=False) as client,
    ):
        yield client


@pytest.fixture
def guarded(settings: Settings, runtime: Runtime) -> Iterator[TestClient]:
    secured = settings.model_copy(update={"api_token": SecretStr(TOKEN)})
    app = create_app(secured, role="api", options=CATCHING_UP)
    with (
        ProjectionSupervisor(secured, runtime.db, sessions=runtime.sessions, poll_interval=0.1),
        TestClient(app, raise_server_exceptions=False) as client,
    ):
        yield client


def _blocked_session(client: TestClient, runtime: Runtime, headers: dict[str, str]) -> str:
    created = client.post("/v1/sessions", json={"title": TITLE}, headers=headers)
    sid = str(created.json()["session_id"])
    interrupt_a_turn(runtime, sid)
    position = client.post("/v1/sessions", json={}, headers=headers).json()["position"]
    assert client.get(f"/v1/sessions?min_position={position}", headers=headers).status_code == 200
    return sid


# ------------------------------------------------------------------ the token


def test_with_a_token_console_pages_are_shells_without_session_data(
    guarded: TestClient, runtime: Runtime
) -> None:
    sid = _blocked_session(guarded, runtime, AUTH)

    for path in ("/console", f"/console/sessions/{sid}", "/console/overview"):
        page = guarded.get(path)
        assert page.status_code == 200, path
        assert page.headers["content-type"].startswith("text/html")
        assert TITLE not in page.text
        assert "append_file" not in page.text and "out.txt" not in page.text
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert page.headers["cache-control"] == "no-store"
    assert guarded.get("/console/static/console.js").status_code == 200


def test_every_console_page_names_an_icon_that_is_served(
    guarded: TestClient, runtime: Runtime
) -> None:
    sid = _blocked_session(guarded, runtime, AUTH)

    for path in ("/console", f"/console/sessions/{sid}", "/console/overview"):
        link = re.search(r'<link rel="icon" href="([^"]+)"', guarded.get(path).text)
        assert link is not None, path
        icon = guarded.get(link.group(1))
        assert icon.status_code == 200, path
        assert icon.headers["content-type"].startswith("image/svg+xml")
        assert b"<svg" in icon.content
    fallback = guarded.get("/favicon.ico")  # asked by browsers on pages that name none
    assert fallback.status_code == 200
    assert fallback.headers["content-type"].startswith("image/svg+xml")


def test_with_a_token_every_console_fragment_needs_it(
    guarded: TestClient, runtime: Runtime
) -> None:
    sid = _blocked_session(guarded, runtime, AUTH)
    fragments = (
        "/console/fragments/sessions",
        "/console/fragments/sessions?show=attention",
        f"/console/fragments/sessions/{sid}/timeline",
        "/console/fragments/overview",
    )
    for path in fragments:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            refused = guarded.get(path, headers=headers)
            body = problem(refused, 401, "unauthorized")
            assert TITLE not in refused.text and sid not in str(body), path

    listed = guarded.get("/console/fragments/sessions?show=attention", headers=AUTH)
    timeline = guarded.get(f"/console/fragments/sessions/{sid}/timeline", headers=AUTH)
    assert listed.status_code == timeline.status_code == 200
    assert TITLE in listed.text and TITLE in timeline.text
    assert "append_file" in timeline.text and "out.txt" in timeline.text


def test_an_unknown_session_is_told_only_with_the_token(guarded: TestClient) -> None:
    missing = "00000000-0000-0000-0000-000000000000"
    assert guarded.get(f"/console/sessions/{missing}").status_code == 200  # a shell, no answer
    problem(guarded.get(f"/console/fragments/sessions/{missing}/timeline"), 401, "unauthorized")
    problem(
        guarded.get(f"/console/fragments/sessions/{missing}/timeline", headers=AUTH),
        404,
        "session_not_found",
    )


# ------------------------------------------------------------------ fragments


def test_needs_attention_lists_blocked_sessions_first_then_busy_ones(
    reads: TestClient, runtime: Runtime
) -> None:
    idle = new_session(reads, title="idle one")
    busy = new_session(reads, title="busy one")
    reads.post(f"/v1/sessions/{busy}/turns", json={"message": "hello"})
    blocked = [new_session(reads, title=f"blocked {i}") for i in range(3)]
    for sid in blocked:
        interrupt_a_turn(runtime, sid)
    position = reads.post("/v1/sessions", json={"title": "idle two"}).json()["position"]
    reads.get(f"/v1/sessions?min_position={position}")

    seen, cursor = [], ""
    while True:
        query = "show=attention&limit=2" + (f"&cursor={cursor}" if cursor else "")
        page = reads.get(f"/console/fragments/sessions?{query}")
        assert page.status_code == 200, page.text
        seen += re.findall(r'href="/console/sessions/([0-9a-f-]{36})"', page.text)
        cursor = _next_cursor(page.text)
        if not cursor:
            break

    assert seen[:3] == list(reversed(blocked))  # newest activity first within a group
    assert seen[3:] == [busy]
    assert idle not in seen


def _next_cursor(html: str) -> str:
    marker = 'data-next-cursor="'
    return html.split(marker, 1)[1].split('"', 1)[0]


def test_a_cursor_from_elsewhere_is_refused_as_a_problem(reads: TestClient) -> None:
    problem(
        reads.get("/console/fragments/sessions?show=attention&cursor=idle~x"),
        422,
        "validation_error",
    )
    problem(reads.get("/console/fragments/sessions?show=nope"), 422, "validation_error")
    problem(reads.get("/console/fragments/sessions?bogus=1"), 422, "validation_error")


def test_the_timeline_shows_each_step_call_and_the_decision_for_an_interrupted_turn(
    reads: TestClient, runtime: Runtime
) -> None:
    sid = new_session(reads, title="<script>alert(1)</script>")
    reads.post(f"/v1/sessions/{sid}/turns", json={"message": '/tool echo {"text": "hi"}'})
    run_queued_turn(runtime, sid)
    turn_id, call_id = interrupt_a_turn(runtime, sid)

    html = reads.get(f"/console/fragments/sessions/{sid}/timeline").text

    assert "<script>alert(1)</script>" not in html  # escaped, never markup
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert html.index(">Turn 1</h2>") < html.index(">Turn 2</h2>")
    assert "Tool echo returned" in html and "read only" in html
    assert f'id="resolve-{turn_id}"' in html
    assert f'data-call-id="{call_id}"' in html and "side effecting" in html
    assert "gone:1:dead" in html  # the worker that died
    assert 'data-status="blocked"' in html


def test_the_overview_fragment_renders_every_part_of_the_board(
    reads: TestClient, runtime: Runtime
) -> None:
    sid = new_session(reads)
    interrupt_a_turn(runtime, sid)

    html = reads.get("/console/fragments/overview").text

    for part in ("Open turns", "Tool calls, last hour", "Workers", "Projections", "<svg"):
        assert part in html


def test_a_resolve_whose_result_is_not_json_is_refused_and_records_nothing(
    reads: TestClient, runtime: Runtime
) -> None:
    # What the console checks in the browser, the server checks again.
    sid = new_session(reads)
    _, call_id = interrupt_a_turn(runtime, sid)
    before = reads.get(f"/v1/sessions/{sid}").json()["version"]
    url = f"/v1/sessions/{sid}/tool-calls/{call_id}/resolve"
    broken = b'{"outcome": "succeeded", "result": {"written": tru, "note": "n", "actor": "a"}'

    problem(
        reads.post(url, content=broken, headers={"content-type": "application/json"}),
        422,
        "validation_error",
    )
    missing_note = {"outcome": "succeeded", "result": None, "note": "", "actor": "a"}
    problem(reads.post(url, json=missing_note), 422, "validation_error")
    assert reads.get(f"/v1/sessions/{sid}").json()["version"] == before
    assert reads.get(f"/v1/sessions/{sid}").json()["status"] == "blocked"


# -------------------------------------------------------------- the summaries


def test_open_turns_are_summarised_by_state_with_the_oldest(
    reads: TestClient, runtime: Runtime
) -> None:
    queued = new_session(reads)
    reads.post(f"/v1/sessions/{queued}/turns", json={"message": "hi"})
    interrupt_a_turn(runtime, new_session(reads))
    head = reads.post("/v1/sessions", json={}).json()["position"]

    summary = reads.get(f"/v1/open-turns/summary?min_position={head}")

    assert summary.status_code == 200, summary.text
    items = {item["state"]: item for item in summary.json()["items"]}
    assert [items[s]["count"] for s in ("queued", "running", "interrupted")] == [1, 0, 1]
    assert items["queued"]["oldest_submitted_at"] and items["interrupted"]["oldest_submitted_at"]
    assert items["running"]["oldest_submitted_at"] is None


def test_tool_call_activity_counts_recent_calls_by_state_in_buckets(
    reads: TestClient, runtime: Runtime
) -> None:
    done = new_session(reads)
    reads.post(f"/v1/sessions/{done}/turns", json={"message": '/tool echo {"text": "x"}'})
    run_queued_turn(runtime, done)
    interrupt_a_turn(runtime, new_session(reads))
    head = reads.post("/v1/sessions", json={}).json()["position"]

    answer = reads.get(f"/v1/tool-calls/activity?buckets=6&min_position={head}")

    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["by_state"]["succeeded"] == 1 and body["by_state"]["unknown"] == 1
    assert sum(body["by_state"].values()) == 2
    assert len(body["buckets"]) == 6 and body["bucket_seconds"] == 600
    assert sum(b["total"] for b in body["buckets"]) == 2
    assert body["buckets"][-1]["total"] == 2  # both just now: the newest bucket
    starts = [datetime.fromisoformat(b["start"]) for b in body["buckets"]]
    assert starts == sorted(starts)
    assert (datetime.fromisoformat(body["until"]) - starts[0]).total_seconds() == 3600


def test_an_empty_window_counts_zero_in_every_state(reads: TestClient) -> None:
    body = reads.get("/v1/tool-calls/activity?window_seconds=60&buckets=1").json()

    assert set(body["by_state"]) >= {"started", "succeeded", "unknown", "resolved"}
    assert sum(body["by_state"].values()) == 0
    assert body["buckets"][0]["total"] == 0


@pytest.mark.parametrize(
    "query", ["window_seconds=59", "window_seconds=999999999", "buckets=0", "buckets=121"]
)
def test_activity_windows_out_of_range_are_422(reads: TestClient, query: str) -> None:
    problem(reads.get(f"/v1/tool-calls/activity?{query}"), 422, "validation_error")


def test_the_summaries_need_the_token_when_one_is_set(guarded: TestClient) -> None:
    for path in ("/v1/open-turns/summary", "/v1/tool-calls/activity"):
        problem(guarded.get(path), 401, "unauthorized")
        assert guarded.get(path, headers=AUTH).status_code == 200


def test_needs_attention_also_lists_sessions_whose_last_turn_failed_after_the_busy_ones(
    reads: TestClient, runtime: Runtime
) -> None:
    failed = new_session(reads, title="failed one")
    reads.post(f"/v1/sessions/{failed}/turns", json={"message": "/tool no_such_tool {}"})
    run_queued_turn(runtime, failed)
    busy = new_session(reads, title="busy one")
    reads.post(f"/v1/sessions/{busy}/turns", json={"message": "hello"})
    fine = new_session(reads, title="fine one")
    reads.post(f"/v1/sessions/{fine}/turns", json={"message": "hello"})
    run_queued_turn(runtime, fine)
    position = reads.post("/v1/sessions", json={"title": "last"}).json()["position"]
    reads.get(f"/v1/sessions?min_position={position}")

    page = reads.get("/console/fragments/sessions?show=attention").text
    seen = re.findall(r'href="/console/sessions/([0-9a-f-]{36})"', page)
    assert seen == [busy, failed]  # the completed and empty sessions need nothing
    assert page.index("Busy — ") < page.index("Failed — the last turn failed") < page.index(failed)


def test_the_search_box_finds_sessions_by_id_prefix_or_title(reads: TestClient) -> None:
    payroll = new_session(reads, title="Quarterly PAYROLL run")
    other = new_session(reads, title="100% done_here")
    position = reads.post("/v1/sessions", json={"title": "unrelated"}).json()["position"]
    reads.get(f"/v1/sessions?min_position={position}")

    def found(q: str) -> list[str]:
        page = reads.get("/console/fragments/sessions", params={"q": q})
        assert page.status_code == 200, page.text
        return re.findall(r'href="/console/sessions/([0-9a-f-]{36})"', page.text)

    assert found("payroll") == [payroll]  # any case, any part of the title
    assert found(payroll[:8]) == [payroll]  # an id prefix
    assert found(payroll[:8].upper()) == [payroll]
    assert found("100%") == [other] and found("%") == [other]  # % is text, not a wildcard
    assert found("e_h") == [other]
    assert found("nothing like it") == []
    empty = reads.get("/console/fragments/sessions?q=zzz").text
    assert "id starts with, or title contains" in empty
    shell = reads.get("/console").text
    assert 'id="q"' in shell and 'type="search"' in shell


def test_an_interrupted_turn_shows_when_and_by_which_recovery(
    reads: TestClient, runtime: Runtime
) -> None:
    sid = new_session(reads, title="interrupted")
    interrupt_a_turn(runtime, sid)

    html = reads.get(f"/console/fragments/sessions/{sid}/timeline").text

    note = html.split('class="interrupted-note"', 1)[1].split("</p>", 1)[0]
    assert "Interrupted <time datetime=" in note
    assert f'by the recovery of <code class="id">{runtime.executor.worker_id}</code>' in note
    assert "gone:1:dead" in note  # the owner that died


# ------------------------------------------------------------ paged timeline


def _numbers(html: str) -> list[int]:
    return [int(n) for n in re.findall(r">Turn (\d+)</h2>", html)]


def _attribute(html: str, name: str) -> str:
    return html.split(f'{name}="', 1)[1].split('"', 1)[0]


def test_the_timeline_shows_the_latest_turns_and_pages_earlier_ones_by_the_api_cursor(
    reads: TestClient, runtime: Runtime
) -> None:
    sid = new_session(reads, title="long enough to page")
    for n in range(1, 6):
        reads.post(f"/v1/sessions/{sid}/turns", json={"message": f"message number {n}"})
        run_queued_turn(runtime, sid)

    latest = reads.get(f"/console/fragments/sessions/{sid}/timeline?limit=2").text

    assert _numbers(latest) == [4, 5]  # the latest page, oldest first
    assert "message number 3" not in latest and "message number 5" in latest
    assert "<dd>5</dd>" in latest  # the count of every turn, not of the page
    assert _attribute(latest, "data-low") == "4"
    assert "Load earlier turns" in latest and "Showing the latest 2 of 5 turns." in latest
    cursor = _attribute(latest, "data-next-cursor")
    api = reads.get(f"/v1/sessions/{sid}/turns?limit=2").json()
    assert cursor == api["next_cursor"]  # the same paged read as the API

    before = reads.get(f"/console/fragments/sessions/{sid}/turns?cursor={cursor}&limit=2").text
    assert _numbers(before) == [2, 3]
    assert "session-head" not in before  # only the turns
    first = reads.get(
        f"/console/fragments/sessions/{sid}/turns?cursor={_attribute(before, 'data-next-cursor')}"
        "&limit=2"
    ).text
    assert _numbers(first) == [1]
    assert _attribute(first, "data-next-cursor") == ""  # the first turn: nothing earlier

    # A page left open follows from the first turn it showed, however many arrive.
    since = reads.get(f"/console/fragments/sessions/{sid}/timeline?since=2").text
    assert _numbers(since) == [2, 3, 4, 5]


def test_each_turn_names_the_versions_of_its_raw_events(
    reads: TestClient, runtime: Runtime
) -> None:
    sid = new_session(reads, title="raw ranges")
    reads.post(f"/v1/sessions/{sid}/turns", json={"message": '/tool echo {"text": "a"}'})
    run_queued_turn(runtime, sid)
    reads.post(f"/v1/sessions/{sid}/turns", json={"message": "second"})

    html = reads.get(f"/console/fragments/sessions/{sid}/timeline").text

    turns = {
        turn_id: (int(first), last)
        for turn_id, first, last in re.findall(
            r'data-raw-for="([^"]+)" data-key="[^"]+"\s+data-first="(\d+)" data-last="(\d*)"', html
        )
    }
    events = reads.get(f"/v1/sessions/{sid}/events?limit=1000").json()["events"]
    assert len(turns) == 2
    for turn_id, (first, last) in turns.items():
        mine = [e["version"] for e in events if e["payload"].get("turn_id") == turn_id]
        if last:  # finished: exactly its range
            assert mine == list(range(first, int(last) + 1))
        else:  # open (queued): from its first version to the head
            assert mine == list(range(first, events[-1]["version"] + 1))
        assert f"({len(mine)})" in html  # the count before the panel is opened


def test_the_paged_timeline_refuses_bad_paging_as_problems(reads: TestClient) -> None:
    sid = new_session(reads)
    base = f"/console/fragments/sessions/{sid}"
    problem(reads.get(f"{base}/turns?cursor=nope"), 422, "invalid_cursor")
    problem(reads.get(f"{base}/turns"), 422, "validation_error")  # a cursor is required
    problem(reads.get(f"{base}/timeline?limit=0"), 422, "validation_error")
    problem(reads.get(f"{base}/timeline?since=0"), 422, "validation_error")
    other = reads.get("/v1/sessions?limit=1").json()["next_cursor"] or "WyJzZXNzaW9ucyJd"
    problem(reads.get(f"{base}/turns?cursor={other}"), 422, "invalid_cursor")


# ------------------------------------------------------------- turn control


def _caught_up(client: TestClient) -> None:
    position = client.post("/v1/sessions", json={"title": "marker"}).json()["position"]
    assert client.get(f"/v1/sessions?min_position={position}").status_code == 200


def test_a_call_awaiting_approval_is_listed_under_needs_attention_and_decided_on_the_timeline(
    reads: TestClient, runtime: Runtime
) -> None:
    busy = new_session(reads, title="busy one")
    reads.post(f"/v1/sessions/{busy}/turns", json={"message": "hello"})
    sid = new_session(reads, title="needs a yes", tools=["append_file"], approval_policy="all")
    args = '{"path": "out.txt", "text": "approve me"}'
    tid = reads.post(f"/v1/sessions/{sid}/turns", json={"message": f"/tool append_file {args}"})
    tid = tid.json()["turn_id"]
    run_queued_turn(runtime, sid)  # the model asks; the call is proposed, nothing runs
    call_id = reads.get(f"/v1/sessions/{sid}/turns/{tid}").json()["tool_calls"][0]["call_id"]
    _caught_up(reads)

    page = reads.get("/console/fragments/sessions?show=attention").text
    seen = re.findall(r'href="/console/sessions/([0-9a-f-]{36})"', page)
    assert seen == [sid, busy]  # awaiting approval before busy
    assert page.index("Awaiting approval — ") < page.index("Busy — ")
    assert f'href="/console/sessions/{sid}#approve-{call_id}"' in page
    only = reads.get("/console/fragments/sessions?show=awaiting_approval").text
    assert re.findall(r'href="/console/sessions/([0-9a-f-]{36})"', only) == [sid]

    html = reads.get(f"/console/fragments/sessions/{sid}/timeline").text
    assert f'id="approve-{call_id}"' in html
    assert f'data-action="approve" data-call-id="{call_id}"' in html
    assert f'data-action="reject" data-call-id="{call_id}"' in html
    assert "&#34;approve me&#34;" in html  # the arguments, escaped, to edit
    assert f'data-action="cancel" data-turn-id="{tid}"' in html
    assert 'name="force"' not in html  # no one runs the turn: nothing to force
    assert "Awaiting approval since" in html

    # Edited arguments the schema refuses: the problem the dialog shows, nothing written.
    url = f"/v1/sessions/{sid}/tool-calls/{call_id}/approve"
    bad = reads.post(url, json={"actor": "ops", "arguments": {"path": "out.txt", "text": 5}})
    assert problem(bad, 422, "invalid_tool_arguments")["detail"]
    rejected = reads.post(
        f"/v1/sessions/{sid}/tool-calls/{call_id}/reject",
        json={"actor": "ops@example", "reason": "not that file"},
    )
    assert rejected.status_code == 200, rejected.text

    html = reads.get(f"/console/fragments/sessions/{sid}/timeline").text
    assert f'id="approve-{call_id}"' not in html
    assert "<strong>rejected</strong> by ops@example: “not that file”" in html


def test_an_approved_call_shows_who_approved_it_and_the_edited_arguments(
    reads: TestClient, runtime: Runtime
) -> None:
    sid = new_session(reads, tools=["append_file"], approval_policy="side_effecting")
    args = '{"path": "out.txt", "text": "asked"}'
    reads.post(f"/v1/sessions/{sid}/turns", json={"message": f"/tool append_file {args}"})
    run_queued_turn(runtime, sid)
    call_id = reads.get(f"/v1/sessions/{sid}/turns").json()["items"][0]["tool_calls"][0]["call_id"]
    edited = {"path": "out.txt", "text": "edited"}
    approved = reads.post(
        f"/v1/sessions/{sid}/tool-calls/{call_id}/approve",
        json={"actor": "ops@example", "note": "checked", "arguments": edited},
    )
    assert approved.status_code == 200, approved.text
    run_queued_turn(runtime, sid)

    html = reads.get(f"/console/fragments/sessions/{sid}/timeline").text

    assert "approved by ops@example: “checked”" in html
    assert "with edited arguments (the model asked for" in html and "asked" in html
    assert 'data-status="idle"' in html


def test_a_cancelled_turn_shows_who_cancelled_it_and_why(reads: TestClient) -> None:
    sid = new_session(reads)
    tid = reads.post(f"/v1/sessions/{sid}/turns", json={"message": "hello"}).json()["turn_id"]
    html = reads.get(f"/console/fragments/sessions/{sid}/timeline").text
    assert f'data-action="cancel" data-turn-id="{tid}"' in html
    assert "it is cancelled at once" in html

    cancelled = reads.post(
        f"/v1/sessions/{sid}/turns/{tid}/cancel",
        json={"actor": "ops@example", "reason": "sent by mistake"},
    )
    assert cancelled.status_code == 200, cancelled.text

    html = reads.get(f"/console/fragments/sessions/{sid}/timeline").text
    assert "Cancelled by ops@example</h3>" in html
    assert "sent by mistake" in html
    assert f'data-action="cancel" data-turn-id="{tid}"' not in html
    assert "badge-cancelled" in html
