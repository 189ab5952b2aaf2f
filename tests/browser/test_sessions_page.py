"""The sessions list in a browser: statuses in words, filters, needs attention, paging."""

from __future__ import annotations

import re
from collections.abc import Iterator
from uuid import UUID

import pytest

from tests.api.conftest import interrupt_a_turn, run_queued_turn
from tests.browser.conftest import Page, Server, expect, screenshot, serve
from tests.fault.cluster import cluster
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database
from turnlog.interface.bootstrap import build_runtime

# title → who asked for it (each is left in a different state below)
SESSIONS = {
    "Weekly metrics digest": "reports-bot",
    "Vendor contract review": "legal@acme",
    "Nightly invoice export": "billing-cron",
    "Support inbox triage": "helpdesk",
    "Customer onboarding": "sales@acme",
    "Refund request #4411": "payments-agent",
}


@pytest.fixture(scope="module")
def listed(
    module_settings: Settings, database: Database
) -> Iterator[tuple[Server, dict[str, str]]]:
    """An API and a projection runner, no worker: each session stays as this test leaves it."""
    runtime = build_runtime(module_settings)
    with cluster(module_settings, database) as c:
        server = serve(c, "api")
        c.projections()
        ids = {title: server.new_session(title, who) for title, who in SESSIONS.items()}
        closing = {"reason": "signed", "actor": "legal"}
        server.request("POST", f"/v1/sessions/{ids['Vendor contract review']}/close", json=closing)
        for title, message in (
            ("Nightly invoice export", "Export last night's invoices"),
            ("Support inbox triage", '/tool echo {"text": "3 new tickets"}'),
        ):
            server.submit(ids[title], message)
            run_queued_turn(runtime, ids[title])
        server.submit(ids["Customer onboarding"], "Welcome the new customer")
        interrupt_a_turn(runtime, ids["Refund request #4411"])
        for extra in ("Fleet telemetry summary", "Data retention audit"):
            ids[extra] = server.new_session(extra, "ops")
        server.caught_up()
        yield server, ids
    runtime.close()


def test_sessions_are_listed_with_status_in_words_turns_and_last_activity(
    page: Page, listed: tuple[Server, dict[str, str]]
) -> None:
    server, ids = listed
    page.goto(f"{server.url}/console")

    rows = page.locator("table.sessions tbody tr")
    expect(rows).to_have_count(len(ids))
    expected = {
        "Weekly metrics digest": ("idle", "0"),
        "Vendor contract review": ("closed", "0"),
        "Nightly invoice export": ("idle", "1"),
        "Customer onboarding": ("busy", "1"),
        "Refund request #4411": ("blocked", "1"),
    }
    for title, (status, turns) in expected.items():
        row = rows.filter(has=page.get_by_role("link", name=title))
        expect(row.locator("td").nth(0).locator(".badge")).to_have_text(re.compile(status))
        expect(row.locator("td.num")).to_have_text(turns)
        expect(row.locator("time")).to_have_text(re.compile(r"\d+ (s|min) ago"))
    blocked = rows.filter(has=page.get_by_role("link", name="Refund request #4411"))
    expect(blocked).to_contain_text("1 call of unknown outcome")
    expect(blocked.locator(".badge").nth(1)).to_have_text(re.compile("interrupted"))
    screenshot(page, "sessions")

    page.get_by_role("link", name="Nightly invoice export").click()
    expect(page).to_have_url(f"{server.url}/console/sessions/{ids['Nightly invoice export']}")
    expect(page.locator(".turn")).to_have_count(1)
    expect(page.locator(".msg.reply")).to_contain_text("Echo: Export last night's invoices")


def test_filters_by_status_and_needs_attention_lists_blocked_sessions_first(
    page: Page, listed: tuple[Server, dict[str, str]]
) -> None:
    server, _ = listed
    page.goto(f"{server.url}/console")
    expect(page.locator("table.sessions tbody tr")).to_have_count(8)

    page.get_by_label("Show").select_option("attention")
    page.get_by_role("button", name="Apply").press("Enter")  # keyboard, not a mouse
    rows = page.locator("table.sessions tbody tr:not(.group)")
    expect(rows).to_have_count(2)
    expect(rows.nth(0)).to_contain_text("Refund request #4411")
    expect(rows.nth(1)).to_contain_text("Customer onboarding")
    groups = page.locator("tr.group")
    expect(groups.nth(0)).to_contain_text("Blocked")
    expect(groups.nth(1)).to_contain_text("Busy")
    assert "show=attention" in page.url  # the filter is in the address, to share

    page.get_by_label("Show").select_option("closed")
    page.get_by_role("button", name="Apply").click()
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("Vendor contract review")


def test_sessions_are_paged_forwards_and_back(
    page: Page, listed: tuple[Server, dict[str, str]]
) -> None:
    server, ids = listed
    page.goto(f"{server.url}/console?limit=3")
    rows = page.locator("table.sessions tbody tr")
    seen: list[str] = []
    for number in (1, 2, 3):
        expect(page.locator("#page-number")).to_have_text(f"Page {number}")
        expect(rows).to_have_count(3 if number < 3 else 2)
        seen += [UUID(href.rsplit("/", 1)[1]).hex for href in _links(page)]
        if number < 3:
            page.get_by_role("button", name="Next").click()
    expect(page.get_by_role("button", name="Next")).to_be_disabled()
    assert sorted(seen) == sorted(UUID(i).hex for i in ids.values())  # each once

    page.get_by_role("button", name="Previous").click()
    expect(page.locator("#page-number")).to_have_text("Page 2")
    page.get_by_role("button", name="First page").click()
    expect(page.locator("#page-number")).to_have_text("Page 1")
    expect(page.get_by_role("button", name="Previous")).to_be_disabled()


def _links(page: Page) -> list[str]:
    return [str(a.get_attribute("href")) for a in page.locator("table.sessions tbody th a").all()]


def test_the_search_box_finds_a_session_by_title_or_id_prefix(
    page: Page, listed: tuple[Server, dict[str, str]]
) -> None:
    server, ids = listed
    page.goto(f"{server.url}/console")
    rows = page.locator("table.sessions tbody tr:not(.group)")
    expect(rows).to_have_count(8)

    page.get_by_label("Search").fill("refund")
    page.get_by_role("button", name="Apply").press("Enter")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("Refund request #4411")
    assert "q=refund" in page.url  # the search is in the address, to share

    page.get_by_label("Search").fill(ids["Weekly metrics digest"][:8])
    page.get_by_role("button", name="Apply").click()
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("Weekly metrics digest")
