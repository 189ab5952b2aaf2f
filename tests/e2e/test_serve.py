"""End to end: real `turnlog serve` processes, killed or stopped, then replaced."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import caught_up, eventually
from tests.conftest import ROOT, turnlog, turnlog_env
from tests.deadlines import scaled
from tests.fault.cluster import free_port
from turnlog.application.settings import Settings

pytestmark = pytest.mark.fault


@contextmanager
def server(
    settings: Settings, log: Path, *args: str
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """Start `turnlog serve` on a free port and wait (with a deadline) until /readyz is 200."""
    port = free_port()
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "turnlog", "serve", "--port", str(port), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=turnlog_env(settings),
            cwd=ROOT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, url, log)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path, deadline: float = 60) -> None:
    end = time.monotonic() + scaled(deadline)
    while time.monotonic() < end:
        assert proc.poll() is None, f"serve exited {proc.returncode}:\n{log.read_text()}"
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"not ready within {deadline}s:\n{log.read_text()}")


def ask(url: str, session_id: str, message: str) -> dict[str, Any]:
    response = httpx.post(
        f"{url}/v1/sessions/{session_id}/turns?wait=30", json={"message": message}, timeout=40
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    assert body["state"] == "completed", body
    return body


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_a_replacement_server_finds_the_session_and_recalls_the_codeword(
    settings: Settings, tmp_path: Path, stop: signal.Signals
) -> None:
    log = tmp_path / "serve.log"
    with server(settings, log) as (first, url):
        created = httpx.post(f"{url}/v1/sessions", json={"title": "restart"}, timeout=10)
        session_id = created.json()["session_id"]
        stored = ask(url, session_id, "The codeword is kestrel")
        assert stored["reply"] == "Noted. I will remember the codeword."
        # It says where to point a client, a browser and the API's docs.
        assert f"API {url}/v1  docs {url}/docs  console {url}/console" in log.read_text()
        first.send_signal(stop)
        code = first.wait(timeout=40)
        # SIGTERM: uvicorn shuts down gracefully, then re-raises the signal.
        assert code in ((-signal.SIGKILL,) if stop is signal.SIGKILL else (0, -signal.SIGTERM))

    with server(settings, log) as (_, url):
        # The new process's runners catch up first (each ask waits up to serve's 5 s).
        at = f"{url}/v1/sessions?min_position={stored['position']}"
        answer = caught_up(lambda: httpx.get(at, timeout=10))
        assert answer.status_code == 200, answer.text
        listed = answer.json()
        assert session_id in [row["session_id"] for row in listed["items"]]
        recalled = ask(url, session_id, "What is the codeword?")

    assert recalled["reply"] == "The codeword is kestrel."
    if stop is signal.SIGTERM:
        assert "Shutting down" in log.read_text()


def test_sigterm_answers_in_flight_requests_and_a_replacement_finishes_the_turn(
    settings: Settings, tmp_path: Path
) -> None:
    log = tmp_path / "serve.log"
    answers: list[httpx.Response] = []
    with server(settings, log) as (first, url):
        session_id = httpx.post(f"{url}/v1/sessions", json={}, timeout=10).json()["session_id"]

        def submit_and_wait() -> None:
            answers.append(
                httpx.post(
                    f"{url}/v1/sessions/{session_id}/turns?wait=30",
                    json={"message": '/tool sleep {"seconds": 1.5}'},
                    timeout=40,
                )
            )

        waiting = threading.Thread(target=submit_and_wait)
        waiting.start()
        eventually(lambda: "ToolCallStarted" in event_types(url, session_id), deadline=30)
        first.send_signal(signal.SIGTERM)  # the tool is running and a client is waiting
        waiting.join(40)
        assert first.wait(timeout=40) in (0, -signal.SIGTERM)

    [answer] = answers  # answered, not cut off: 202 with the state at shutdown, or 200
    assert answer.status_code in (200, 202), answer.text
    turn_id = answer.json()["turn_id"]
    with server(settings, log) as (_, url):
        turn_url = f"{url}/v1/sessions/{session_id}/turns/{turn_id}"
        turn = eventually(
            lambda: (t := httpx.get(turn_url, timeout=5).json())["state"] == "completed" and t,
            deadline=30,
        )
    assert turn["reply"].startswith('Tool sleep returned: {"slept": 1.5}')


def event_types(url: str, session_id: str) -> list[str]:
    page = httpx.get(f"{url}/v1/sessions/{session_id}/events", timeout=5).json()
    return [e["type"] for e in page["events"]]


def test_serving_on_a_public_address_without_a_token_is_refused(settings: Settings) -> None:
    done = turnlog(settings, "serve", "--host", "0.0.0.0", "--port", str(free_port()))

    assert done.returncode == 2
    assert "without an API token" in done.stderr
    assert "TURNLOG_API_TOKEN" in done.stderr


@pytest.mark.parametrize("second", [False, True], ids=["one-sigint", "two-sigints"])
def test_sigint_drains_like_sigterm_and_leaves_a_long_tool_call_to_recovery(
    settings: Settings, tmp_path: Path, second: bool
) -> None:
    log = tmp_path / "serve.log"
    drain = 2.0
    with server(settings, log, "--drain-timeout", str(drain)) as (proc, url):
        session_id = httpx.post(f"{url}/v1/sessions", json={}, timeout=10).json()["session_id"]
        queued = httpx.post(
            f"{url}/v1/sessions/{session_id}/turns",
            json={"message": '/tool sleep {"seconds": 60}'},
            timeout=10,
        )
        assert queued.status_code == 202, queued.text
        eventually(lambda: "ToolCallStarted" in event_types(url, session_id), deadline=30)
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)  # Ctrl-C while the tool sleeps
        if second:
            eventually(lambda: "SIGINT: stopping" in log.read_text(), deadline=10)
            proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=drain + 30)
        took = time.monotonic() - started
    output = log.read_text()
    assert took < scaled(drain + 5), f"took {took:.1f}s:\n{output}"
    assert code == 128 + signal.SIGINT, output
    assert "Traceback" not in output and "turn crashed" not in output, output
    if second:
        assert "second SIGINT: exiting now" in output
    else:
        assert "left for recovery" in output
