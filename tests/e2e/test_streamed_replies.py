"""Streamed replies through a real `turnlog serve --role all`: live deltas, whole stored reply.

The model is a local OpenAI-compatible stub that streams its reply in 20
chunks and holds after the tenth until the test has seen deltas on the
session's event stream: so the deltas are seen while the reply is still being
written, before any ``ModelReplied`` exists. Then the server is killed and
another started: the record holds the whole reply, and nothing of the deltas.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT, turnlog_env
from tests.deadlines import scaled
from tests.e2e.test_serve import wait_ready
from tests.fault.cluster import free_port
from tests.openai_stub import StubOpenAI, pieces, streamed
from turnlog import Client
from turnlog.application.settings import Settings
from turnlog.interface.client.models import Delta, Event

pytestmark = pytest.mark.fault

TEXT = "A reply written for this test, long enough to be cut into twenty visible pieces."


@pytest.fixture
def stub() -> Iterator[StubOpenAI]:
    server = StubOpenAI().start()
    yield server
    server.stop()


def serve(settings: Settings, log: Path, stub: StubOpenAI) -> tuple[subprocess.Popen[bytes], str]:
    env = turnlog_env(settings, TURNLOG_OPENAI_BASE_URL=stub.url, TURNLOG_OPENAI_MAX_RETRIES="0")
    port = free_port()
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "turnlog", "serve", "--port", str(port), "--role", "all"],
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


class Follower:
    """``Client.follow(deltas=True)`` in a thread, keeping every item until the turn ends."""

    def __init__(self, url: str, session_id: str) -> None:
        self.items: list[Event | Delta] = []
        self.error: BaseException | None = None
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, args=(url, session_id), daemon=True)
        self._thread.start()

    def _run(self, url: str, session_id: str) -> None:
        try:
            with Client(url) as client:
                for item in client.follow(session_id, deltas=True):
                    with self._changed:
                        self.items.append(item)
                        self._changed.notify_all()
                    if isinstance(item, Event) and item.type == "TurnCompleted":
                        return
        except BaseException as exc:
            self.error = exc
            with self._changed:
                self._changed.notify_all()

    def wait_for(self, what: str, test: Any, deadline: float = 30.0) -> None:
        end = time.monotonic() + scaled(deadline)
        with self._changed:
            while not test(self.items):
                assert self.error is None, f"the follower failed: {self.error!r}"
                left = end - time.monotonic()
                assert left > 0, f"no {what} within {deadline}s; saw {self.items}"
                self._changed.wait(left)


def deltas(items: list[Event | Delta]) -> list[Delta]:
    return [i for i in items if isinstance(i, Delta)]


def types(items: list[Event | Delta]) -> list[str]:
    return ["delta" if isinstance(i, Delta) else i.type for i in items]


def test_deltas_reach_a_live_stream_before_the_stored_reply_and_never_the_record(
    settings: Settings, tmp_path: Path, stub: StubOpenAI
) -> None:
    log = tmp_path / "serve.log"
    hold = threading.Event()
    stub.script(streamed(TEXT, 20, hold=hold, hold_after=10))
    proc, url = serve(settings, log, stub)
    try:
        created = httpx.post(f"{url}/v1/sessions", json={"provider": "openai", "model": "m"})
        assert created.status_code == 201, created.text
        session_id = str(created.json()["session_id"])
        follower = Follower(url, session_id)
        follower.wait_for("SessionStarted", lambda items: "SessionStarted" in types(items))

        turn = httpx.post(f"{url}/v1/sessions/{session_id}/turns", json={"message": "Hi"})
        assert turn.status_code == 202, turn.text
        # Half the reply is out; the model has not finished, so nothing is stored yet.
        follower.wait_for("ten deltas", lambda items: len(deltas(items)) >= 10)
        assert "ModelReplied" not in types(follower.items)
        hold.set()
        follower.wait_for("TurnCompleted", lambda items: "TurnCompleted" in types(items))
    finally:
        hold.set()
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)

    seen = follower.items
    assert [d.text for d in deltas(seen)] == pieces(TEXT, 20)
    replied = types(seen).index("ModelReplied")
    assert types(seen)[replied - 20 : replied] == ["delta"] * 20  # every delta came first
    assert {(d.turn_id, d.step) for d in deltas(seen)} == {(turn.json()["turn_id"], 1)}

    # Another process: the record has the whole reply, and no trace of the pieces.
    proc, url = serve(settings, log, stub)
    try:
        with Client(url) as client:
            page = client.events(session_id)
            replay: list[Event | Delta] = []
            for item in client.follow(session_id, deltas=True):
                replay.append(item)
                if isinstance(item, Event) and item.type == "TurnCompleted":
                    break
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    stored = [e.type for e in page.events]
    assert stored == [t for t in types(seen) if t != "delta"]
    assert types(replay) == stored  # replayed from the start: no delta among them
    [model_replied] = [e for e in page.events if e.type == "ModelReplied"]
    assert model_replied.payload["text"] == TEXT
    assert len(stub.requests) == 1
