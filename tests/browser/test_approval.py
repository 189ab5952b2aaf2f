"""An operator approves a proposed tool call from the browser: found under "Needs
attention", arguments edited (a schema refusal shown first), the call then runs once."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.browser.conftest import Page, Server, expect, screenshot, serve
from tests.fault.cluster import cluster, poll
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database

ASK = '/tool append_file {"path": "approved.txt", "text": "as asked"}'


@pytest.fixture(scope="module")
def server(module_settings: Settings, database: Database) -> Iterator[Server]:
    """`turnlog serve` with everything in one process: API, a worker, projections."""
    with cluster(module_settings, database) as c:
        yield serve(c, "all")


def test_approving_a_proposed_call_with_edited_arguments_runs_it_once(
    page: Page, server: Server, module_settings: Settings
) -> None:
    body = {"title": "Vendor payout 7781", "tools": ["append_file"], "approval_policy": "all"}
    created = server.request("POST", "/v1/sessions", json=body)
    assert created.status_code == 201, created.text
    sid = str(created.json()["session_id"])
    tid = server.submit(sid, ASK)["turn_id"]
    waiting = poll(
        lambda: (t := server.turn(sid, tid))["state"] == "awaiting_approval" and t,
        60,
        "the call proposed",
    )
    call_id = waiting["tool_calls"][0]["call_id"]
    server.caught_up()

    page.goto(f"{server.url}/console?show=attention")
    listed = page.locator(f'li[data-call-id="{call_id}"]')
    expect(listed).to_contain_text("append_file")
    expect(page.locator("tr.group")).to_contain_text(["Awaiting approval"])
    listed.get_by_role("link", name="Approve or reject…").click()

    form = page.locator(f'form[data-action=approve][data-call-id="{call_id}"]')
    expect(page.locator(f"#turn-{tid} .turn-head .badge")).to_have_text(
        re.compile("awaiting approval")
    )
    arguments = form.get_by_label(re.compile("Arguments, as JSON"))
    expect(arguments).to_have_value(re.compile('"text": "as asked"'))
    arguments.fill('{"path": "approved.txt", "text": 5}')  # JSON, but not the tool's schema
    form.get_by_label(re.compile("Note")).fill("payout checked")
    form.get_by_role("button", name="Approve…").click()
    dialog = page.locator("dialog#confirm")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("with the arguments as you edited them")
    dialog.get_by_label("Your name (recorded as the actor)").fill("kim@ops")
    dialog.get_by_role("button", name="Approve the call").click()
    expect(form.locator(".form-error")).to_be_visible()  # the server's 422, in words
    expect(form.locator(".form-error")).to_contain_text(re.compile("text", re.I))
    assert server.turn(sid, tid)["state"] == "awaiting_approval"  # nothing written

    arguments.fill('{"path": "approved.txt", "text": "as edited"}')
    form.get_by_role("button", name="Approve…").click()
    dialog.get_by_label("Your name (recorded as the actor)").fill("kim@ops")
    screenshot(page, "approve-dialog", full_page=False)
    dialog.get_by_role("button", name="Approve the call").click()

    turn = page.locator(f"#turn-{tid}")
    expect(turn.locator(".turn-head .badge")).to_have_text(re.compile("completed"))
    expect(turn.locator("tr.call")).to_contain_text("approved by kim@ops: “payout checked”")
    expect(turn.locator("tr.call")).to_contain_text("with edited arguments")
    recorded = server.turn(sid, tid)["tool_calls"][0]
    assert (recorded["state"], recorded["approval"]) == ("succeeded", "approved")
    written = Path(module_settings.sandbox_root) / sid / "approved.txt"
    assert written.read_text() == "as edited\n"
