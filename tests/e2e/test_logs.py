"""JSON logs of a real `turnlog serve`: parseable line by line, ids attached, no secrets.

The server runs with a bearer token and an OpenAI key; one session uses the
OpenAI-compatible provider (a local stub) and calls a tool, another uses the
fixture provider. A client also puts the token in a query string, the way a
careless script would, so the access log sees it and must redact it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT, turnlog_env
from tests.e2e.test_serve import wait_ready
from tests.fault.cluster import free_port
from tests.openai_stub import StubOpenAI, reply, tool_calls
from tests.unit.test_docker import LONG_RUNNING, exec_form, instructions, services
from turnlog.application.settings import Settings

pytestmark = pytest.mark.fault

TOKEN = "tok-e2e-4b1d9c7e"
KEY = "sk-e2e-secret-9f8e7d6c5b4a"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def stub() -> Iterator[StubOpenAI]:
    server = StubOpenAI().start()
    yield server
    server.stop()


def serve(settings: Settings, log: Path, stub: StubOpenAI) -> tuple[subprocess.Popen[bytes], str]:
    env = turnlog_env(
        settings,
        TURNLOG_LOG_FORMAT="json",
        TURNLOG_API_TOKEN=TOKEN,
        TURNLOG_OPENAI_API_KEY=KEY,
        TURNLOG_OPENAI_BASE_URL=stub.url,
        TURNLOG_OPENAI_MAX_RETRIES="0",
        # A real provider's sessions leave out the demo tools unless chosen; this test calls echo.
        TURNLOG_DEFAULT_TOOLS="echo",
    )
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "turnlog", "serve", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, url, log)
    except BaseException:
        proc.kill()
        proc.wait(30)
        raise
    return proc, url


def finished_turn(url: str, session_id: str, message: str) -> dict[str, Any]:
    response = httpx.post(
        f"{url}/v1/sessions/{session_id}/turns?wait=30",
        json={"message": message},
        headers=AUTH,
        timeout=40,
    )
    assert response.status_code == 200, response.text
    turn: dict[str, Any] = response.json()
    assert turn["state"] == "completed", turn
    return turn


def new_session(url: str, **fields: Any) -> str:
    created = httpx.post(f"{url}/v1/sessions", json=fields, headers=AUTH, timeout=10)
    assert created.status_code == 201, created.text
    return str(created.json()["session_id"])


def test_json_logs_carry_request_and_execution_ids_and_never_a_secret(
    settings: Settings, tmp_path: Path, stub: StubOpenAI
) -> None:
    log = tmp_path / "serve.log"
    proc, url = serve(settings, log, stub)
    try:
        openai = new_session(url, provider="openai", model="stub-model")
        stub.script(tool_calls(("call_stub_1", "echo", '{"text": "hi"}')), reply("Done."))
        remote = finished_turn(url, openai, "Call the echo tool.")
        fixture = new_session(url, title="fixture")
        local = finished_turn(url, fixture, '/tool echo {"text": "x"}')
        leaked = httpx.get(f"{url}/v1/sessions?token={TOKEN}", headers=AUTH, timeout=10)
        assert leaked.status_code == 422  # an unknown query parameter, logged as requested
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=40)

    raw = log.read_text()
    assert TOKEN not in raw and KEY not in raw
    lines = [json.loads(line) for line in raw.splitlines() if line.strip()]  # each line parses
    assert lines and all({"time", "level", "logger", "message"} <= set(e) for e in lines)

    requests = [e for e in lines if e["logger"] == "uvicorn.access"]
    assert requests and all(len(e.get("request_id", "")) == 32 for e in requests)
    turn_request = next(e for e in requests if f"/v1/sessions/{openai}/turns" in e["message"])
    assert turn_request["session_id"] == openai
    assert any("token=[redacted]" in e["message"] for e in requests)

    execution = [e for e in lines if e["logger"] == "turnlog.execution"]
    for session_id, turn in ((openai, remote), (fixture, local)):
        mine = [e for e in execution if e.get("session_id") == session_id]
        assert mine, f"no execution lines for session {session_id}"
        assert all(e["turn_id"] == turn["turn_id"] and e["worker_id"] for e in mine)
        [tool_line] = [e for e in mine if e["message"].startswith("tool echo")]
        assert tool_line["call_id"] == turn["tool_calls"][0]["call_id"]
    assert stub.requests[0].headers["authorization"] == f"Bearer {KEY}"  # it was really used


def test_a_large_body_does_not_lend_its_ids_to_later_requests_on_the_connection(
    settings: Settings, tmp_path: Path, stub: StubOpenAI
) -> None:
    """A body over the server's read buffer (64 KiB) pauses and resumes reading from inside
    its request; later requests on the keep-alive connection logged with its session id."""
    log = tmp_path / "serve.log"
    proc, url = serve(settings, log, stub)
    try:
        first, second = new_session(url), new_session(url)
        with httpx.Client(base_url=url, headers=AUTH, timeout=30) as client:
            big = client.post(f"/v1/sessions/{first}/turns", json={"message": "x" * (70 * 1024)})
            assert big.status_code == 422  # too long a message; the body was read whole
            for _ in range(3):
                assert client.get("/healthz").status_code == 200
            assert client.get(f"/v1/sessions/{second}").status_code == 200
            assert client.get("/v1/sessions").status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=40)

    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    access = [e for e in lines if e["logger"] == "uvicorn.access"]
    big_line = next(e for e in access if f"/v1/sessions/{first}/turns" in e["message"])
    assert big_line["session_id"] == first
    later = access[access.index(big_line) + 1 :]
    assert [e["message"].split('"')[1].split()[1] for e in later] == (
        ["/healthz"] * 3 + [f"/v1/sessions/{second}", "/v1/sessions"]
    )
    assert [e.get("session_id") for e in later] == [None, None, None, second, None]
    assert len({e["request_id"] for e in later}) == len(later)


def test_the_images_healthcheck_programs_pass_against_a_running_server(
    settings: Settings, tmp_path: Path, stub: StubOpenAI
) -> None:
    """The Dockerfile's (/healthz) and compose's (/readyz) probes, run as written."""
    [check] = instructions("HEALTHCHECK")
    probes = [exec_form(check.split(" CMD ", 1)[1])]
    probes += [services()[role]["healthcheck"]["test"][1:] for role in LONG_RUNNING]
    proc, url = serve(settings, tmp_path / "serve.log", stub)
    port = url.rsplit(":", 1)[1]
    try:
        for argv in probes:
            assert argv[0] == "python"
            program = argv[2].replace("127.0.0.1:8000", f"127.0.0.1:{port}")
            done = subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=20)
            assert done.returncode == 0, done.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=40)
