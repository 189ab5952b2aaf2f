"""The client against real `turnlog serve` processes: restarts, dropped streams, refusals."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from uuid import UUID

import httpx
import pytest

import turnlog
from tests.api.conftest import eventually
from tests.conftest import ROOT, turnlog_env
from tests.e2e.test_serve import wait_ready
from tests.fault.cluster import free_port
from tests.fault.proxy import Proxy
from turnlog.application.settings import Settings
from turnlog.interface.client.models import Event, Turn

pytestmark = [pytest.mark.fault, pytest.mark.timeout(300)]
TOKEN = "client-test-token"


@contextmanager
def serve(settings: Settings, log: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = free_port()
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "turnlog", "serve", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=turnlog_env(settings, TURNLOG_API_TOKEN=TOKEN),
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


def last_turn_if_finished(client: turnlog.Client, session_id: UUID) -> Turn | None:
    turn = client.list_turns(session_id, limit=1).items[0]
    return turn if turn.finished else None


def test_the_codeword_is_recalled_across_a_sigkill_and_unknown_calls_refuse_turns(
    settings: Settings, tmp_path: Path
) -> None:
    log = tmp_path / "serve.log"
    with serve(settings, log) as (first, url), turnlog.Client(url, token=TOKEN) as client:
        session = client.create_session("recall")
        stored = client.submit_turn(session.session_id, "The codeword is kestrel", wait=30)
        assert stored.reply == "Noted. I will remember the codeword."
        slow = '/tool append_file {"path": "a.txt", "text": "x", "delay_seconds": 30}'
        client.submit_turn(session.session_id, slow)
        eventually(
            lambda: any(
                t.state == "started" for t in client.tool_calls(session_id=session.session_id).items
            ),
            deadline=60,
        )
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)

    with serve(settings, log) as (_, url), turnlog.Client(url, token=TOKEN) as client:
        listed = list(client.iter_sessions(page_size=1, min_position=stored.position))
        assert session.session_id in [row.session_id for row in listed]
        turn = eventually(lambda: last_turn_if_finished(client, session.session_id), 60)
        assert turn.state == "interrupted" and turn.unknown_call_ids
        with pytest.raises(turnlog.ApiError) as refused:
            client.submit_turn(session.session_id, "What is the codeword?")
        assert refused.value.code == "unresolved_turn" and refused.value.status == 409
        client.abandon_turn(session.session_id, turn.turn_id, reason="checked a.txt", actor="ops")
        recalled = client.submit_turn(session.session_id, "What is the codeword?", wait=30)
    assert recalled.reply == "The codeword is kestrel."


def test_follow_resumes_across_a_dropped_connection_without_loss_or_repeat(
    settings: Settings, tmp_path: Path
) -> None:
    with serve(settings, tmp_path / "serve.log") as (_, url):
        port = int(url.rsplit(":", 1)[1])
        proxy = Proxy({"host": "127.0.0.1", "port": port})
        proxy.up()
        through = f"http://127.0.0.1:{proxy.port}"
        seen: list[int] = []
        with turnlog.Client(url, token=TOKEN) as direct:
            sid = direct.create_session("follow").session_id

            def follow() -> None:
                with turnlog.Client(through, token=TOKEN) as client:
                    for item in client.follow(sid, reconnect_for=60):
                        assert isinstance(item, Event)
                        seen.append(item.version)
                        if item.payload.get("reply") == "Echo: last":
                            return

            reader = threading.Thread(target=follow, daemon=True)
            reader.start()
            direct.submit_turn(sid, "first", wait=30)
            eventually(lambda: len(seen) >= 5, deadline=60)
            proxy.down()  # every open connection is cut; new ones are refused for a while
            for message in ("second", "third"):
                direct.submit_turn(sid, message, wait=30)
            proxy.up()
            direct.submit_turn(sid, "last", wait=30)
            reader.join(90)
            assert not reader.is_alive(), f"the stream stopped at {seen}"
            stored = [e.version for e in direct.events(sid, limit=1000).events]
    assert seen == stored == list(range(1, len(stored) + 1))


def test_refusals_reach_the_client_as_typed_errors_with_their_codes(
    settings: Settings, tmp_path: Path
) -> None:
    with serve(settings, tmp_path / "serve.log") as (_, url):
        with turnlog.Client(url) as anonymous, pytest.raises(turnlog.ApiError) as caught:
            anonymous.workers()
        assert (caught.value.status, caught.value.code) == (401, "unauthorized")
        with turnlog.Client(url, token=TOKEN) as client:
            sid = client.create_session("refusals").session_id
            cases = {
                "session_not_found": lambda: client.get_session(
                    "00000000-0000-4000-8000-000000000000"
                ),
                "turn_not_found": lambda: client.get_turn(sid, "nope"),
                "invalid_message": lambda: client.submit_turn(sid, ""),
                "validation_error": lambda: client.list_sessions(limit=0),
            }
            for code, attempt in cases.items():
                with pytest.raises(turnlog.ApiError) as caught:
                    attempt()
                assert caught.value.code == code, caught.value
            client.submit_turn(sid, '/tool sleep {"seconds": 5}')
            with pytest.raises(turnlog.ApiError) as caught:
                client.submit_turn(sid, "again")
            assert (caught.value.status, caught.value.code) == (409, "turn_in_progress")
            eventually(lambda: client.list_turns(sid, limit=1).items[0].finished, deadline=60)
            client.close_session(sid, actor="ops", reason="done")
            with pytest.raises(turnlog.ApiError) as caught:
                client.submit_turn(sid, "after close")
            assert caught.value.code == "session_closed"


def test_fork_and_search_through_both_clients(settings: Settings, tmp_path: Path) -> None:
    with serve(settings, tmp_path / "serve.log") as (_, url):
        with turnlog.Client(url, token=TOKEN) as client:
            sid = client.create_session("Triage", metadata={"team": "ops", "tier": 2}).session_id
            turn = client.submit_turn(sid, "hello", wait=30)
            assert turn.state == "completed"
            version = client.get_session(sid).version
            fork = client.fork_session(
                sid, version=version, title="Triage fork", idempotency_key="k"
            )
            again = client.fork_session(
                sid, version=version, title="Triage fork", idempotency_key="k"
            )
            assert again.session_id == fork.session_id
            assert fork.forked_from is not None and fork.forked_from.version == version
            own = {k: v for k, v in fork.metadata.items() if not k.startswith("turnlog.")}
            assert fork.turn_count == 1 and own == {"team": "ops", "tier": 2}
            assert fork.metadata["turnlog.idempotency"]["key"] == "k"  # its own key's record
            with pytest.raises(turnlog.ApiError) as caught:
                client.fork_session(sid, version=version - 1)
            assert caught.value.code == "fork_inside_turn"

            def found() -> list[str]:
                rows = client.iter_sessions(
                    search="triage", metadata={"tier": 2}, page_size=1, min_position=fork.position
                )
                return [str(r.title) for r in rows]

            assert eventually(lambda: found() == ["Triage fork", "Triage"], deadline=60)

        async def with_aio() -> tuple[list[str], str]:
            async with turnlog.AsyncClient(url, token=TOKEN) as aio:
                page = await aio.list_sessions(search="triage f", metadata={"team": "ops"})
                forked = await aio.fork_session(fork.session_id, version=1)
                return [str(r.title) for r in page.items], str(forked.forked_from)

        titles, source = asyncio.run(with_aio())
        assert titles == ["Triage fork"]
        assert str(fork.session_id) in source


def test_a_web_server_that_is_not_turnlog_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "index.html").write_text("<html><body>It works!</body></html>")
    handler = partial(SimpleHTTPRequestHandler, directory=str(tmp_path))
    with ThreadingHTTPServer(("127.0.0.1", 0), handler) as other:
        threading.Thread(target=other.serve_forever, daemon=True).start()
        try:
            client = turnlog.Client(f"http://127.0.0.1:{other.server_address[1]}")
            with client, pytest.raises(turnlog.NotATurnlogServer, match="turnlog server"):
                client.create_session("x")
        finally:
            other.shutdown()


def test_a_url_nobody_serves_is_unreachable_not_a_traceback() -> None:
    client = turnlog.Client(f"http://127.0.0.1:{free_port()}", retry=turnlog.RetryPolicy(2, 0, 0))
    with client, pytest.raises(turnlog.ServerUnreachable):
        client.workers()
    assert httpx  # the client's transport
