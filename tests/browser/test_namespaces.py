"""A server over a tenants file: the console shows the token's namespace, and an admin's
token gets a picker of every namespace served."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.browser.conftest import Page, Server, expect, serve
from tests.fault.cluster import cluster
from tests.tenants_support import TenantsFile, drop_namespaces
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database

TITLE = "Quarterly close checklist"


@pytest.fixture(scope="module")
def tenanted(
    module_settings: Settings, database: Database, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, TenantsFile, str, str]]:
    base = module_settings.namespace
    team, other = f"{base}_t", f"{base}_o"
    file = TenantsFile(Path(tmp_path_factory.mktemp("tenants")) / "tenants.toml")
    file.token("team", team, "client")
    file.token("root", other, "admin")
    file.write()
    try:
        with cluster(module_settings, database) as c:
            server = serve(c, "all", TURNLOG_TENANTS_FILE=str(file.path))
            created = httpx.post(
                f"{server.url}/v1/sessions", json={"title": TITLE}, headers=file.headers("team")
            )
            assert created.status_code == 201, created.text
            yield server, file, team, other
    finally:
        drop_namespaces(database, (team, other))


def _use_token(page: Page, server: Server, token: str) -> None:
    page.goto(f"{server.url}/console")
    page.get_by_label("API token", exact=True).fill(token)
    page.get_by_role("button", name="Use this token").click()


def test_a_client_token_sees_its_namespace_and_its_sessions(
    page: Page, tenanted: tuple[Server, TenantsFile, str, str]
) -> None:
    server, file, team, _ = tenanted
    _use_token(page, server, file.tokens["team"][0])
    expect(page.locator("#namespace")).to_have_text(team)
    expect(page.get_by_role("link", name=TITLE)).to_be_visible()
    expect(page.locator("#namespace-picker")).to_have_count(0)


def test_an_admin_picks_a_namespace_and_sees_its_sessions(
    page: Page, tenanted: tuple[Server, TenantsFile, str, str]
) -> None:
    server, file, team, other = tenanted
    _use_token(page, server, file.tokens["root"][0])
    picker = page.get_by_label("Namespace")
    expect(picker).to_have_value(other)
    expect(page.locator("#main")).to_be_visible()
    expect(page.get_by_role("link", name=TITLE)).to_have_count(0)
    picker.select_option(team)
    expect(page.get_by_label("Namespace")).to_have_value(team)
    expect(page.get_by_role("link", name=TITLE)).to_be_visible()
    assert page.evaluate("sessionStorage.getItem('turnlog.namespace')") == team
