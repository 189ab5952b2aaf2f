"""A session's timeline in a browser, following a running turn live; and the overview."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.browser.conftest import Page, Server, expect, screenshot, serve
from tests.fault.cluster import cluster
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database


@pytest.fixture(scope="module")
def server(module_settings: Settings, database: Database) -> Iterator[Server]:
    """`turnlog serve` with everything in one process: API, a worker, projections."""
    with cluster(module_settings, database) as c:
        yield serve(c, "all")


def raw_types(page: Page, turn_id: str) -> list[str]:
    rows = page.locator(f"#turn-{turn_id} details.raw tbody tr")
    return [str(t) for t in rows.evaluate_all("rows => rows.map(r => r.dataset.type)")]


def test_a_timeline_shows_each_turn_with_its_steps_tool_calls_and_reply(
    page: Page, server: Server
) -> None:
    sid = server.new_session("Support inbox triage")
    first = server.submit(sid, '/tool echo {"text": "3 new tickets"}', wait=30)
    assert first["state"] == "completed"

    page.goto(f"{server.url}/console/sessions/{sid}")

    turn = page.locator(f"#turn-{first['turn_id']}")
    expect(turn.get_by_role("heading", name="Turn 1")).to_be_visible()
    expect(turn.locator(".turn-head .badge")).to_have_text(re.compile("completed"))
    expect(turn.locator(".msg.user")).to_contain_text('/tool echo {"text": "3 new tickets"}')
    expect(turn.locator(".step")).to_have_count(2)  # asked for the call; then answered
    call = turn.locator("tr.call")
    expect(call.locator("code.tool")).to_have_text("echo")
    expect(call.locator("td").nth(0)).to_have_text("read only")
    expect(call.locator(".badge")).to_have_text(re.compile("succeeded"))
    expect(call.locator("td.num").nth(0)).to_have_text("1")  # attempt
    expect(call.locator("td.num").nth(1)).to_have_text(re.compile(r"^\d+\.\d\d s$"))
    expect(call.locator("td").nth(4)).to_contain_text(":")  # the worker, host:pid:…
    expect(turn.locator(".msg.reply")).to_contain_text(
        'Tool echo returned: {"text": "3 new tickets"}'
    )

    turn.get_by_text("Raw events of turn 1").click()  # a collapsible panel per turn
    expect(turn.locator("details.raw tbody tr").first).to_be_visible()
    assert raw_types(page, first["turn_id"]) == [
        "TurnSubmitted",
        "TurnClaimed",
        "ModelReplied",
        "ToolCallStarted",
        "ToolCallSucceeded",
        "ModelReplied",
        "TurnCompleted",
    ]
    header = turn.locator("details.raw thead th")
    expect(header).to_have_text(["Position", "Version", "Type", "Time", "Payload", "Fork"])
    expect(turn.locator("details.raw tbody tr").nth(3)).to_contain_text('"call_id"')


def test_fork_here_on_a_turns_last_event_opens_a_new_session_forked_there(
    page: Page, server: Server
) -> None:
    sid = server.new_session("Fork me")
    first = server.submit(sid, "the first question", wait=30)
    assert first["state"] == "completed"
    page.goto(f"{server.url}/console/sessions/{sid}")
    turn = page.locator(f"#turn-{first['turn_id']}")
    turn.get_by_text("Raw events of turn 1").click()
    expect(turn.locator("details.raw tr[data-type=TurnCompleted]")).to_have_count(1)
    # Only the events between turns offer it: none inside the turn.
    expect(turn.locator("button.fork-here")).to_have_count(1)
    completed = turn.locator("details.raw tr[data-type=TurnCompleted]")
    version = int(completed.locator("td.num").nth(1).inner_text())

    completed.get_by_role("button", name="Fork here").click()

    expect(page).not_to_have_url(re.compile(f"/console/sessions/{sid}$"))
    fork_id = page.url.rsplit("/", 1)[-1]
    expect(page.locator(".session-head h1")).to_have_text("Fork me")
    source = page.locator(".session-head .forked-from")
    expect(source).to_contain_text(f"{sid} at version {version}")
    expect(source.get_by_role("link")).to_have_attribute("href", f"/console/sessions/{sid}")
    shown = server.request("GET", f"/v1/sessions/{fork_id}").json()
    assert shown["forked_from"]["session_id"] == sid
    assert shown["forked_from"]["version"] == version
    assert shown["turn_count"] == 1


def test_a_running_turn_appears_live_without_a_reload(page: Page, server: Server) -> None:
    sid = server.new_session("Live timeline")
    page.goto(f"{server.url}/console/sessions/{sid}")
    expect(page.locator("#live")).to_have_attribute("data-state", "live")
    expect(page.locator(".empty")).to_contain_text("No turns yet")
    page.evaluate("window.stillTheSamePage = true")

    turn_id = server.submit(sid, '/tool sleep {"seconds": 2}')["turn_id"]

    turn = page.locator(f"#turn-{turn_id}")
    expect(turn).to_be_visible()
    turn.get_by_text("Raw events of turn 1").click()
    call = turn.locator("tr.call")
    # The call runs for 2 s: it is seen running, then finished, as the events arrive.
    # One look sees both the badge and the running time: two looks may fall on either
    # side of the end on a busy machine.
    expect(call).to_contain_text(re.compile(r"started[\s\S]*running"))
    assert "ToolCallStarted" in raw_types(page, turn_id)
    expect(turn.locator("details.raw tr[data-type=ToolCallSucceeded]")).to_have_count(1)
    expect(call.locator(".badge")).to_have_text(re.compile("succeeded"))
    expect(turn.locator(".msg.reply")).to_have_text(
        re.compile(r'Tool sleep returned: \{"slept": 2(\.0)?\}')
    )
    types = raw_types(page, turn_id)
    assert types.index("ToolCallStarted") < types.index("ToolCallSucceeded")
    assert types[-1] == "TurnCompleted"
    assert page.evaluate("window.stillTheSamePage") is True  # never reloaded
    expect(page.locator(".session-head .badge")).to_have_text(re.compile("idle"))


def test_a_long_timeline_shows_its_latest_turns_and_loads_earlier_ones_on_request(
    page: Page, server: Server
) -> None:
    sid = server.new_session("Paged timeline")
    turns = [server.submit(sid, f"note {n}", wait=30)["turn_id"] for n in range(1, 6)]
    requested: list[str] = []
    page.on("request", lambda r: requested.append(r.url))

    page.goto(f"{server.url}/console/sessions/{sid}?limit=2")

    expect(page.locator("#live")).to_have_attribute("data-state", "live")
    headings = page.locator("ol.turns > li h2")
    expect(headings).to_have_text(["Turn 4", "Turn 5"])  # one page: the latest turns
    expect(page.locator(".earlier-count")).to_have_text("Showing the latest 2 of 5 turns.")
    # Neither the timeline nor the live stream read the session from its first event.
    assert not any("events?after=0" in url for url in requested), requested
    page.evaluate("window.stillTheSamePage = true")

    more = page.get_by_role("button", name="Load earlier turns")
    more.click()
    expect(headings).to_have_text(["Turn 2", "Turn 3", "Turn 4", "Turn 5"])
    more.click()
    expect(headings).to_have_text(["Turn 1", "Turn 2", "Turn 3", "Turn 4", "Turn 5"])
    expect(more).to_be_hidden()  # nothing earlier than the first turn
    expect(page.locator(".earlier-count")).to_have_text("Showing the latest 5 of 5 turns.")

    first = page.locator(f"#turn-{turns[0]}")
    first.get_by_text("Raw events of turn 1").click()  # read by its version range
    expect(first.locator("details.raw tbody tr").first).to_be_visible()
    assert raw_types(page, turns[0]) == [
        "TurnSubmitted",
        "TurnClaimed",
        "ModelReplied",
        "TurnCompleted",
    ]

    sixth = server.submit(sid, "note 6")["turn_id"]  # live events keep appearing
    expect(page.locator(f"#turn-{sixth} .msg.reply")).to_be_visible()
    expect(headings).to_have_text([f"Turn {n}" for n in range(1, 7)])  # earlier pages stay
    expect(first.locator("details.raw tbody tr")).to_have_count(4)
    assert page.evaluate("window.stillTheSamePage") is True


def test_the_overview_shows_open_turns_tool_calls_workers_and_projection_lag(
    page: Page, server: Server
) -> None:
    sid = server.new_session("Overview sample")
    server.submit(sid, '/tool echo {"text": "for the board"}', wait=30)
    server.caught_up()

    page.goto(f"{server.url}/console/overview")

    open_turns = page.locator("section", has=page.get_by_role("heading", name="Open turns"))
    # One row per open state: queued, running, awaiting approval, interrupted.
    expect(open_turns.locator("tbody tr")).to_have_count(4)
    expect(open_turns.locator("tbody tr", has_text="interrupted")).to_have_count(1)
    expect(open_turns.locator("tbody tr", has_text="awaiting approval")).to_have_count(1)
    calls = page.locator("section", has=page.get_by_role("heading", name="Tool calls, last hour"))
    expect(calls.locator("svg[role=img] rect")).not_to_have_count(0)
    succeeded = calls.locator("tbody tr", has_text="succeeded")
    expect(succeeded.locator("td.num")).not_to_have_text("0")
    workers = page.locator("section", has=page.get_by_role("heading", name=re.compile("Workers")))
    expect(workers.locator("tbody tr").first).to_contain_text("working")
    expect(workers.locator("tbody tr").first).to_contain_text(re.compile(r"\d+(\.\d)? s ago"))
    projections = page.locator("section", has=page.get_by_role("heading", name="Projections"))
    expect(projections.locator("tbody tr")).to_have_count(3)
    for row in projections.locator("tbody tr").all():
        expect(row).to_contain_text("caught up")
    expect(page.locator("#updated")).to_contain_text("Updated")
    screenshot(page, "overview")
