"""A real `turnlog serve` over a tenants file: reloads on SIGHUP, refusals at start-up, and
turns scheduled fairly across namespaces."""

from __future__ import annotations

import json
import signal
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.api.conftest import eventually
from tests.conftest import turnlog
from tests.e2e.test_serve import server
from tests.tenants_support import TenantsFile, drop_namespaces
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database

pytestmark = pytest.mark.fault


@pytest.fixture
def two_namespaces(database: Database, namespace: str) -> Iterator[tuple[str, str]]:
    a, b = f"{namespace}_a", f"{namespace}_b"
    yield a, b
    drop_namespaces(database, (a, b))


def _settings(settings: Settings, file: TenantsFile, namespace: str) -> Settings:
    return settings.model_copy(update={"tenants_file": file.write(), "namespace": namespace})


def _status(url: str, headers: dict[str, str]) -> int:
    return httpx.get(f"{url}/v1/whoami", headers=headers, timeout=10).status_code


def _file(tmp_path: Path, **tokens: tuple[str, str]) -> TenantsFile:
    """A tenants file with these tokens (name=(namespace, role))."""
    file = TenantsFile(tmp_path / "tenants.toml")
    for name, (namespace, role) in tokens.items():
        file.token(name, namespace, role)
    return file


def test_sighup_reloads_the_tokens_and_a_bad_file_keeps_the_previous_one(
    settings: Settings, tmp_path: Path, two_namespaces: tuple[str, str]
) -> None:
    a, b = two_namespaces
    file = _file(tmp_path, old=(a, "client"))
    file.quotas[b] = {}
    log = tmp_path / "serve.log"
    with server(_settings(settings, file, a), log) as (proc, url):
        old = file.headers("old")
        assert _status(url, old) == 200
        new_secret = file.token("new", b, "reader")
        new = {"Authorization": f"Bearer {new_secret}"}
        assert _status(url, new) == 401
        del file.tokens["old"]
        file.write()
        proc.send_signal(signal.SIGHUP)
        eventually(lambda: _status(url, new) == 200 and _status(url, old) == 401, deadline=30)
        assert httpx.get(f"{url}/v1/whoami", headers=new).json()["namespace"] == b
        # A bad file: logged, and the one read before stays in force.
        file.path.write_text(file.path.read_text().replace('"reader"', '"superuser"'))
        proc.send_signal(signal.SIGHUP)
        eventually(lambda: "not reloaded" in log.read_text(), deadline=30)
        assert "superuser" in log.read_text()
        assert _status(url, new) == 200 and _status(url, old) == 401
        assert proc.poll() is None


def test_serve_refuses_a_bad_tenants_file_naming_the_entry(
    settings: Settings, tmp_path: Path
) -> None:
    path = tmp_path / "tenants.toml"
    path.write_text('[[tokens]]\nname = "ci"\nnamespace = "team_a"\nrole = "client"\n')
    ran = turnlog(settings.model_copy(update={"tenants_file": path}), "serve", "--port", "0")
    assert ran.returncode == 2, ran.stderr
    assert "tokens[0] (ci)" in ran.stderr and "sha256" in ran.stderr


def test_a_flooding_namespace_cannot_starve_a_quiet_one(
    settings: Settings, tmp_path: Path, two_namespaces: tuple[str, str]
) -> None:
    """A floods 200 turns; B's one turn still finishes within 2x its idle latency.

    Each turn's model step takes 0.5 s (the fixture model's /slow), as a real
    model's would, so what is measured is how long B's turn waits for a worker.
    """
    loud, quiet = two_namespaces
    file = _file(tmp_path, loud=(loud, "client"), quiet=(quiet, "client"))
    log = tmp_path / "serve.log"
    with (
        server(_settings(settings, file, loud), log, "--concurrency", "2") as (_, url),
        httpx.Client(base_url=url, timeout=60) as http,
    ):
        loud_h, quiet_h = file.headers("loud"), file.headers("quiet")

        def new(headers: dict[str, str]) -> str:
            created = http.post("/v1/sessions", json={}, headers=headers)
            assert created.status_code == 201, created.text
            return str(created.json()["session_id"])

        def turn(headers: dict[str, str], sid: str) -> float:
            started = time.perf_counter()
            done = http.post(
                f"/v1/sessions/{sid}/turns?wait=60",
                json={"message": "/slow 0.5 hi"},
                headers=headers,
            )
            assert done.status_code == 200 and done.json()["state"] == "completed", done.text
            return time.perf_counter() - started

        quiet_sid = new(quiet_h)
        idle = statistics.median(turn(quiet_h, quiet_sid) for _ in range(3))
        for sid in [new(loud_h) for _ in range(200)]:
            queued = http.post(
                f"/v1/sessions/{sid}/turns", json={"message": "/slow 0.5 hi"}, headers=loud_h
            )
            assert queued.status_code == 202, queued.text
        loaded = turn(quiet_h, quiet_sid)
        still_open = http.get("/v1/open-turns/summary", headers=loud_h).json()
        assert sum(s["count"] for s in still_open["items"]) >= 100, still_open
        assert loaded <= 2 * idle, f"quiet turn {loaded:.2f}s under a flood, {idle:.2f}s idle"


def test_projections_status_lists_every_namespace_of_the_file(
    settings: Settings, tmp_path: Path, two_namespaces: tuple[str, str]
) -> None:
    a, b = two_namespaces
    file = _file(tmp_path, a=(a, "client"), b=(b, "reader"))
    scoped = _settings(settings, file, a)
    assert turnlog(scoped, "db", "init").returncode == 0
    ran = turnlog(scoped, "projections", "status", "--json")
    assert ran.returncode == 0, ran.stderr
    rows = json.loads(ran.stdout)
    assert {r["namespace"] for r in rows} == {a, b}
    assert {r["name"] for r in rows if r["namespace"] == b} == {
        r["name"] for r in rows if r["namespace"] == a
    }
    shown = turnlog(scoped, "projections", "status")
    assert shown.returncode == 0 and a in shown.stdout and b in shown.stdout
