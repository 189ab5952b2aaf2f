"""An operator decides about turns interrupted by a real SIGKILL, from the browser.

An API, a projection runner and a worker run as separate processes. The worker
starts `append_file` (side-effecting, 5 s before it writes) in two sessions
and is SIGKILLed mid-call; a second worker finds both owners gone and
interrupts both turns. One test abandons a turn, the other records the
call's real outcome; in each the session unblocks without a reload.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.browser.conftest import Locator, Page, Server, expect, screenshot, serve
from tests.fault.cluster import cluster, poll, worker_pid
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database

# The calls wait before they write, long enough that the kill lands in the wait however
# busy the machine (the kill ends it).
APPEND = '/tool append_file {"path": "x.txt", "text": "t", "delay_seconds": 60}'


@dataclass(frozen=True)
class Blocked:
    session_id: str
    turn_id: str
    call_id: str


@pytest.fixture(scope="module")
def blocked(
    module_settings: Settings, database: Database
) -> Iterator[tuple[Server, list[Blocked]]]:
    with cluster(module_settings, database) as c:
        server = serve(c, "api")
        c.projections()
        first = c.worker("w1")
        submitted = []
        for title in ("Ledger sync for vendor 0042", "Refund request #4411"):
            sid = server.new_session(title)
            submitted.append((sid, server.submit(sid, APPEND)["turn_id"]))
        for sid, _ in submitted:
            poll(lambda sid=sid: "ToolCallStarted" in c.topics(sid), 30, "the call started")
        for sid, turn_id in submitted:
            assert worker_pid(server.turn(sid, turn_id)["worker_id"]) == first.pid
        first.kill()  # SIGKILL, inside both append_file calls
        # The second worker starts after the kill: starting a process on a loaded
        # machine can outlast the calls, which then finished before the kill.
        c.worker("w2")  # its start-up check finds both turns orphaned
        found = []
        for sid, turn_id in submitted:
            turn = poll(
                lambda s=sid, t=turn_id: (u := server.turn(s, t))["state"] == "interrupted" and u,
                30,
                "interrupted",
            )
            found.append(Blocked(sid, turn_id, turn["unknown_call_ids"][0]))
        server.caught_up()
        yield server, found


def resolve_section(page: Page, b: Blocked) -> Locator:
    return page.locator(f"#resolve-{b.turn_id}")


def expect_blocked(page: Page, b: Blocked) -> Locator:
    expect(page.locator(".session-head .badge")).to_have_text(re.compile("blocked"))
    expect(page.locator(".alert")).to_contain_text("Blocked.")
    turn = page.locator(f"#turn-{b.turn_id}")
    expect(turn.locator(".turn-head .badge")).to_have_text(re.compile("interrupted"))
    unknown = turn.locator("tr.call-unknown")
    expect(unknown.locator(".badge")).to_have_text(re.compile("outcome unknown"))
    section = resolve_section(page, b)
    call = section.locator(".unknown-call")
    expect(call).to_contain_text("append_file")
    expect(call).to_contain_text(b.call_id)
    expect(call.locator("pre.json")).to_contain_text('"path": "x.txt"')
    expect(call.locator("pre.json")).to_contain_text('"delay_seconds": 60')
    expect(call.locator(".facts")).to_contain_text(
        re.compile(r"Started\s*\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")
    )
    return section


def test_abandoning_an_interrupted_turn_unblocks_the_session(
    page: Page, blocked: tuple[Server, list[Blocked]]
) -> None:
    server, (b, _) = blocked
    page.goto(f"{server.url}/console/sessions/{b.session_id}")
    section = expect_blocked(page, b)
    screenshot(page, "timeline-interrupted")

    abandon = section.locator("form[data-action=abandon]")
    abandon.get_by_role("button", name="Abandon the turn…").click()
    dialog = page.locator("dialog#confirm")
    expect(dialog).not_to_be_visible()  # a reason is required first
    abandon.get_by_label("Reason").fill("Checked the ledger: nothing was written.")
    abandon.get_by_role("button", name="Abandon the turn…").click()

    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("This does not undo anything")
    expect(dialog).to_contain_text("Checked the ledger: nothing was written.")
    dialog.get_by_label("Your name (recorded as the actor)").fill("dana@ops")
    page.keyboard.press("Enter")  # keyboard: submits the dialog's form with its default

    expect(dialog).not_to_be_visible()
    expect(page.locator(".session-head .badge")).to_have_text(re.compile("idle"))
    turn = page.locator(f"#turn-{b.turn_id}")
    expect(turn.locator(".turn-head .badge")).to_have_text(re.compile("abandoned"))
    expect(turn.locator(".msg.abandoned")).to_contain_text("Abandoned by dana@ops")
    expect(page.locator(".resolve")).to_have_count(0)
    assert page.evaluate("sessionStorage.getItem('turnlog.actor')") == "dana@ops"

    recorded = server.turn(b.session_id, b.turn_id)
    assert (recorded["state"], recorded["actor"]) == ("abandoned", "dana@ops")
    next_turn = server.submit(b.session_id, "Try the sync again")  # no longer refused
    expect(page.locator(f"#turn-{next_turn['turn_id']}")).to_contain_text(
        "Echo: Try the sync again"
    )


def test_resolving_an_unknown_call_lets_the_turn_finish_with_that_result(
    page: Page, blocked: tuple[Server, list[Blocked]]
) -> None:
    server, (_, b) = blocked
    page.goto(f"{server.url}/console/sessions/{b.session_id}")
    section = expect_blocked(page, b)
    page.evaluate("window.stillTheSamePage = true")

    form = section.locator("form[data-action=resolve]")
    form.get_by_label("It succeeded").check()
    result = form.get_by_label(re.compile("Result, as JSON"))
    result.fill('{"written": tru')
    form.get_by_label(re.compile("Note")).fill(
        "Looked at x.txt on the host: the line is not there."
    )
    form.get_by_role("button", name="Record the outcome…").click()
    expect(form.locator(".field-error")).to_contain_text("not valid JSON")
    expect(result).to_have_attribute("aria-invalid", "true")
    dialog = page.locator("dialog#confirm")
    expect(dialog).not_to_be_visible()  # refused before any request

    result.fill('{"written": false}')
    expect(form.locator(".field-error")).to_be_hidden()
    form.get_by_role("button", name="Record the outcome…").click()
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("This does not undo anything")
    expect(dialog).to_contain_text(f"call {b.call_id} succeeded")
    dialog.get_by_label("Your name (recorded as the actor)").fill("sam@ops")
    screenshot(page, "resolve-dialog", full_page=False)
    dialog.get_by_role("button", name="Record the outcome").click()

    # The worker continues the turn with the recorded result: seen live, no reload.
    turn = page.locator(f"#turn-{b.turn_id}")
    expect(turn.locator(".turn-head .badge")).to_have_text(re.compile("completed"))
    expect(turn.locator("tr.call .badge")).to_have_text(re.compile("resolved"))
    expect(turn.locator("tr.call")).to_contain_text("recorded as succeeded by sam@ops")
    expect(turn.locator(".msg.reply")).to_contain_text(
        'Tool append_file returned: {"written": false}'
    )
    expect(page.locator(".session-head .badge")).to_have_text(re.compile("idle"))
    assert page.evaluate("window.stillTheSamePage") is True

    recorded = server.turn(b.session_id, b.turn_id)["tool_calls"][0]
    assert (recorded["state"], recorded["result"], recorded["actor"]) == (
        "resolved",
        {"written": False},
        "sam@ops",
    )
