"""Resource bounds on real processes: a stuck tool, a silent provider, 500 event streams.

A tool that never returns is ended by its timeout; a model endpoint that
never answers is given up after bounded retries; a client opening 500 live
event streams gets the server's limit (503 ``too_many_streams``, at once)
for those over it, while everyone else is still served.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.deadlines import scaled
from tests.fault.cluster import Cluster, cluster, poll
from turnlog.application.settings import Settings
from turnlog.application.store.database import Database

pytestmark = pytest.mark.fault


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """A TCP port that accepts connections (the kernel does) and never answers a byte."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"


@pytest.fixture
def served(
    settings: Settings, database: Database, tmp_path: Path, silent_endpoint: str
) -> Iterator[Cluster]:
    tools = tmp_path / "tools.json"
    stuck = {
        "name": "stuck",
        "description": "Never returns.",
        "effect": "read_only",
        "command": ["sleep", "3599.5"],
        "timeout_seconds": 1,
        "parameters": {"type": "object", "properties": {}},
    }
    tools.write_text(json.dumps({"tools": [stuck]}))
    with cluster(settings, database) as c:
        c.api(
            "all",
            TURNLOG_TOOLS_FILE=str(tools),
            TURNLOG_OPENAI_BASE_URL=silent_endpoint,
            TURNLOG_OPENAI_TIMEOUT="1",
            TURNLOG_OPENAI_MAX_RETRIES="1",
            TURNLOG_OPENAI_RETRY_BACKOFF="0.1",
        )
        yield c


def timed_turn(c: Cluster, session_id: str, message: str) -> tuple[dict[str, object], float]:
    started = time.monotonic()
    done = c.submit(session_id, message, wait=30)
    assert done.status_code == 200, done.text
    return done.json(), time.monotonic() - started


def test_a_stuck_tool_is_ended_by_its_timeout_and_the_worker_goes_on(served: Cluster) -> None:
    c = served
    sid = c.new_session()
    turn, seconds = timed_turn(c, sid, "/tool stuck {}")
    assert turn["state"] == "completed"
    assert turn["tool_calls"][0]["state"] == "failed"  # type: ignore[index]
    assert "timed out" in str(turn["tool_calls"][0]["error"]).lower()  # type: ignore[index]
    assert seconds < scaled(10)
    again, _ = timed_turn(c, sid, "next")
    assert again["reply"] == "Echo: next"


def test_a_provider_that_never_answers_fails_the_turn_within_its_bound(served: Cluster) -> None:
    c = served
    silent = c.request("POST", "/v1/sessions", json={"provider": "openai", "model": "m"})
    assert silent.status_code == 201, silent.text
    turn, seconds = timed_turn(c, silent.json()["session_id"], "hello?")
    assert turn["state"] == "failed"
    assert "provider error" in str(turn["error"])
    assert seconds < scaled(12)  # 2 attempts of 1 s, a short backoff, and the rest of the turn
    # Meanwhile and afterwards, other sessions are served.
    other, _ = timed_turn(c, c.new_session(), "still here")
    assert other["reply"] == "Echo: still here"


STREAMS = 500


def test_five_hundred_event_streams_get_the_limit_and_do_not_starve_the_api(
    served: Cluster,
) -> None:
    c = served
    sid = c.new_session()
    # A thread of its own: an earlier test (Playwright's sync API) may leave a loop running here.
    with ThreadPoolExecutor(1) as thread:
        opened, refused, latencies = thread.submit(
            asyncio.run, _open_streams(c.api_url, sid)
        ).result()
    assert opened == 64  # the server's limit (Options.max_streams)
    assert refused == STREAMS - 64
    assert max(latencies) < scaled(3.0), latencies  # everyone else still served, promptly
    # The slots come back when the streams close.
    poll(lambda: _stream_opens(c.api_url, sid), 20, "a stream slot free again")


async def _open_streams(url: str, sid: str) -> tuple[int, int, list[float]]:
    limits = httpx.Limits(max_connections=STREAMS + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:
        held: list[object] = []
        codes: list[int] = []

        async def one() -> None:
            request = client.build_request(
                "GET", f"/v1/sessions/{sid}/events", headers={"accept": "text/event-stream"}
            )
            response = await client.send(request, stream=True)
            codes.append(response.status_code)
            if response.status_code == 200:
                held.append(response)
            else:
                body = json.loads(await response.aread())
                assert body["code"] == "too_many_streams" and response.headers["retry-after"]
                await response.aclose()

        await asyncio.gather(*(one() for _ in range(STREAMS)))
        latencies = [await _latency(client, method, path) for method, path in _others(sid)]
        for response in held:
            await response.aclose()  # type: ignore[attr-defined]
    return codes.count(200), codes.count(503), latencies


def _others(sid: str) -> list[tuple[str, str]]:
    return [
        ("GET", "/healthz"),
        ("GET", f"/v1/sessions/{sid}"),
        ("GET", "/v1/sessions"),
        ("POST", f"/v1/sessions/{sid}/turns"),
        ("GET", f"/v1/sessions/{sid}/events"),
    ]


async def _latency(client: httpx.AsyncClient, method: str, path: str) -> float:
    started = time.monotonic()
    body = {"message": "during the streams"} if method == "POST" else None
    response = await client.request(method, path, json=body)
    assert response.status_code < 300, response.text
    return time.monotonic() - started


def _stream_opens(url: str, sid: str) -> bool:
    with httpx.stream(
        "GET",
        f"{url}/v1/sessions/{sid}/events",
        headers={"accept": "text/event-stream"},
        timeout=10,
    ) as response:
        return response.status_code == 200
