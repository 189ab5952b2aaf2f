"""A token-protected server: the console asks for the token once, keeps it in the tab's
sessionStorage (never in a URL), and shows nothing of a session without it."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from tests.browser.conftest import Page, Request, Server, expect, serve
from tests.fault.cluster import cluster
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database

TOKEN = "tok-browser-51c9e0"
TITLE = "Payroll export for March"


@pytest.fixture(scope="module")
def guarded(module_settings: Settings, database: Database) -> Iterator[tuple[Server, str]]:
    with cluster(module_settings, database) as c:
        server = serve(c, "all", TURNLOG_API_TOKEN=TOKEN)
        sid = server.new_session(TITLE)
        server.submit(sid, "Export the March payroll", wait=30)
        server.caught_up()
        yield server, sid


def test_without_the_token_nothing_is_shown_and_with_it_everything(
    page: Page, guarded: tuple[Server, str]
) -> None:
    server, sid = guarded
    sent: list[Request] = []
    page.on("request", lambda request: sent.append(request))

    page.goto(f"{server.url}/console")
    expect(page.get_by_role("heading", name="This server needs its API token")).to_be_visible()
    expect(page.get_by_label("API token", exact=True)).to_be_focused()
    expect(page.locator("#main")).to_be_hidden()
    assert TITLE not in page.content() and sid not in page.content()
    for path in ("/console", f"/console/sessions/{sid}"):  # what the server sends as the page
        assert TITLE not in httpx.get(server.url + path, timeout=10).text

    page.get_by_label("API token", exact=True).fill("not-the-token")
    page.get_by_label("API token", exact=True).press("Enter")
    expect(page.locator("#auth-error")).to_contain_text("refused that token")
    assert TITLE not in page.content()

    page.get_by_label("API token", exact=True).fill(TOKEN)
    page.get_by_role("button", name="Use this token").click()
    expect(page.get_by_role("link", name=TITLE)).to_be_visible()
    expect(page.locator("#auth")).to_be_hidden()

    # Kept for the tab: the next page needs no second asking, and no URL ever held it.
    page.get_by_role("link", name=TITLE).click()
    expect(page.locator(".msg.reply")).to_contain_text("Echo: Export the March payroll")
    expect(page.locator("#live")).to_have_attribute("data-state", "live")
    assert page.evaluate("sessionStorage.getItem('turnlog.token')") == TOKEN
    assert all(TOKEN not in request.url for request in sent)
    authorised = [r for r in sent if r.headers.get("authorization") == f"Bearer {TOKEN}"]
    assert any("/v1/sessions/" in r.url and "/events?after=" in r.url for r in authorised)

    page.get_by_role("button", name="Forget token").click()
    expect(page.get_by_role("heading", name="This server needs its API token")).to_be_visible()
    assert page.evaluate("sessionStorage.getItem('turnlog.token')") is None
    expect(page.locator("#main")).to_be_hidden()
    assert not re.search(re.escape(TITLE), page.content())
