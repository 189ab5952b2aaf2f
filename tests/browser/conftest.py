"""Browser tests: Debian's headless Chromium, driven by Playwright, against real
`turnlog serve` processes on loopback ports.

They are skipped, saying why, where Chromium or Playwright is missing; `.ci/run`
installs both, so in CI they run. Screenshots go to a temporary folder, or to
docs/screenshots/ (the ones the README shows) with TURNLOG_UPDATE_SCREENSHOTS=1.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT, drop_namespace
from tests.deadlines import scaled
from tests.fault.cluster import Cluster, Process, free_port, poll
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database

SCREENSHOTS = (
    ROOT / "docs" / "screenshots"
    if os.environ.get("TURNLOG_UPDATE_SCREENSHOTS") == "1"
    else Path(os.environ.get("TMPDIR", "/tmp")) / "turnlog-screenshots"
)
CHROMIUM = os.environ.get("TURNLOG_CHROMIUM") or shutil.which("chromium") or ""
# Headless, as root, on a machine with a closed network: no sandbox, no GPU, and none of
# the background connections Chromium would otherwise try at every start.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 15_000

# The test modules import Playwright's names from here, so that without the package
# they are still collected, and then skipped by the hook below, saying why.
try:
    from playwright.sync_api import Browser, Locator, Page, Request, expect, sync_playwright
except ImportError:  # pragma: no cover - the dev extra installs it
    Browser = Locator = Page = Request = Any  # type: ignore[misc,assignment]
    expect = sync_playwright = None  # type: ignore[assignment]

__all__ = ["Locator", "Page", "Request", "Server", "expect", "screenshot", "serve"]


def _missing() -> str:
    if sync_playwright is None:
        return "the playwright package is not installed (pip install -e '.[dev]')"
    if not CHROMIUM or not Path(CHROMIUM).exists():
        return (
            "no Chromium installed: run `make browser-deps` (apt-get install chromium), "
            "or set TURNLOG_CHROMIUM to a Chromium binary; .ci/run does this"
        )
    return ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    reason = _missing()
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.browser)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:
    # Per module, not per session: Playwright's sync API keeps an event loop running in
    # this thread while it is open, and a later test in the same process (a pytest-xdist
    # worker runs many files) would then fail at asyncio.run().
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(chromium: Browser) -> Iterator[Page]:
    """A fresh tab (its own sessionStorage); a script error or a CSP violation fails the test."""
    context = chromium.new_context(viewport={"width": 1280, "height": 860})
    tab = context.new_page()
    timeout = scaled(TIMEOUT_MS)  # milliseconds, stretched by the machine's slowness
    tab.set_default_timeout(timeout)
    expect.set_options(timeout=timeout)
    errors: list[str] = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    # The pages run under a strict Content-Security-Policy: a violation is a bug too.
    tab.on(
        "console",
        lambda m: errors.append(m.text) if "Content Security Policy" in m.text else None,
    )
    yield tab
    context.close()
    assert not errors, f"script errors in the page: {errors}"


def screenshot(tab: Page, name: str, *, full_page: bool = True) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    tab.screenshot(path=str(path), full_page=full_page, animations="disabled")
    return path


@pytest.fixture(scope="module")
def module_settings(
    database: Database, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Settings]:
    """A namespace shared by the tests of one module (servers are slow to start)."""
    namespace = f"t_{uuid.uuid4().hex[:12]}"
    yield Settings(
        database_url=database.conninfo,
        namespace=namespace,
        data_dir=tmp_path_factory.mktemp("browser") / "data",
        snapshot_interval=50,
        probes=False,  # as the settings fixture: the interrupted turns here are an operator's
    )
    drop_namespace(database, namespace)


@dataclass
class Server:
    """A `turnlog serve` process and how to talk to it."""

    process: Process
    url: str
    token: str | None = None

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return httpx.request(method, self.url + path, headers=headers, timeout=60, **kwargs)

    def new_session(self, title: str, created_by: str = "") -> str:
        body = {"title": title, "created_by": created_by}
        created = self.request("POST", "/v1/sessions", json=body)
        assert created.status_code == 201, created.text
        return str(created.json()["session_id"])

    def submit(self, session_id: str, message: str, wait: float | None = None) -> dict[str, Any]:
        params = {"wait": wait} if wait else {}
        path = f"/v1/sessions/{session_id}/turns"
        answer = self.request("POST", path, params=params, json={"message": message})
        assert answer.status_code in (200, 202), answer.text
        return dict(answer.json())

    def caught_up(self) -> None:
        """Wait until every read model has processed the whole log."""

        def no_lag() -> bool:
            answer = self.request("GET", "/v1/projections")
            return answer.status_code == 200 and all(
                p["lag_events"] == 0 for p in answer.json()["items"]
            )

        poll(no_lag, 30, "read models caught up")

    def turn(self, session_id: str, turn_id: str) -> dict[str, Any]:
        answer = self.request("GET", f"/v1/sessions/{session_id}/turns/{turn_id}")
        assert answer.status_code == 200, answer.text
        return dict(answer.json())


def serve(c: Cluster, role: str = "all", **env: str) -> Server:
    """Start `turnlog serve` in the cluster on a free port; wait until /readyz answers 200."""
    port = free_port()
    process = c.start(f"serve-{port}", "serve", "--port", str(port), "--role", role, **env)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if process.proc.poll() is not None:
            raise AssertionError(f"serve exited:\n{process.output()[-3000:]}")
        try:
            return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    poll(ready, 60, "serve ready")
    c.api_url = url
    return Server(process, url, env.get("TURNLOG_API_TOKEN"))
