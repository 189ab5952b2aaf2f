"""Slow clients against a real `turnlog serve`: headers and bodies have deadlines.

A connection that never finishes its headers, or declares a body it never
sends, is answered 408 and closed within the configured timeout (plus slack
that stretches with the machine's load); requests that take longer than
either timeout to *answer* (a turn waited on) are not affected.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator

import pytest

from tests.conftest import raw_events
from tests.deadlines import scaled
from tests.fault.cluster import Cluster, cluster, shared_namespace
from turnlog.application.store.database import Database

pytestmark = pytest.mark.fault

HEADER_TIMEOUT = 1.0
BODY_TIMEOUT = 1.5


@pytest.fixture(scope="module")
def served(database: Database, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    data_dir = tmp_path_factory.mktemp("slow")
    with shared_namespace(database, data_dir) as settings, cluster(settings, database) as c:
        c.api(
            "all",
            TURNLOG_HEADER_TIMEOUT=str(HEADER_TIMEOUT),
            TURNLOG_BODY_TIMEOUT=str(BODY_TIMEOUT),
        )
        yield c


def connect(c: Cluster) -> socket.socket:
    host, port = c.api_url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=5)


def read_until_closed(sock: socket.socket, deadline: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and when it closed; fails at the deadline."""
    started = time.monotonic()
    received = b""
    while True:
        left = started + deadline - time.monotonic()
        assert left > 0, f"connection still open after {deadline:.1f} s; got {received!r}"
        ready, _, _ = select.select([sock], [], [], left)
        if not ready:
            continue
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            return received, time.monotonic() - started
        received += chunk


def read_response(sock: socket.socket) -> bytes:
    """One whole response (headers and its content-length body)."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {received!r}"
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.lower().split(b"\r\n")
        if line.startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {received!r}"
        body += chunk
    return head + b"\r\n\r\n" + body


def slack() -> float:
    return scaled(5)


def test_a_connection_that_never_finishes_its_headers_is_closed(served: Cluster) -> None:
    with connect(served) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        answer, seconds = read_until_closed(sock, HEADER_TIMEOUT + slack())
    print(f"unfinished headers: 408 and closed after {seconds:.2f} s (timeout {HEADER_TIMEOUT} s)")
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert seconds >= HEADER_TIMEOUT * 0.9


def test_a_connection_that_sends_nothing_is_closed_silently(served: Cluster) -> None:
    with connect(served) as sock:
        answer, _ = read_until_closed(sock, HEADER_TIMEOUT + slack())
    assert answer == b""


def test_a_declared_body_that_never_arrives_is_answered_408_and_closed(served: Cluster) -> None:
    before = len(raw_events(served.database, served.settings.namespace))
    with connect(served) as sock:
        sock.sendall(
            b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 1000\r\n\r\n" + b'{"title": "'
        )
        answer, seconds = read_until_closed(sock, BODY_TIMEOUT + slack())
    print(f"missing body: 408 and closed after {seconds:.2f} s (timeout {BODY_TIMEOUT} s)")
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert seconds >= BODY_TIMEOUT * 0.9
    after = len(raw_events(served.database, served.settings.namespace))
    assert after == before, "a request whose body never came wrote something"


def test_a_request_answered_after_both_timeouts_is_not_cut(served: Cluster) -> None:
    session_id = served.new_session()
    # The turn's tool sleeps longer than either timeout; the client waits on it.
    slow = f'/tool sleep {{"seconds": {BODY_TIMEOUT + HEADER_TIMEOUT + 0.5}}}'
    done = served.submit(session_id, slow, wait=60)
    assert done.status_code == 200, done.text
    assert done.json()["state"] == "completed"


def test_an_idle_keep_alive_connection_longer_than_the_header_timeout_is_served(
    served: Cluster,
) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with connect(served) as sock:
        sock.sendall(request)
        assert read_response(sock).startswith(b"HTTP/1.1 200 ")
        # Idle between requests is the keep-alive timeout's (5 s), not the header one's.
        time.sleep(HEADER_TIMEOUT * 1.5)  # pacing the client, not waiting for the server
        sock.sendall(request)
        assert read_response(sock).startswith(b"HTTP/1.1 200 ")


def test_a_header_block_over_its_bound_is_answered_431_before_it_is_buffered(
    served: Cluster,
) -> None:
    sock = connect(served)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
    sent = 0
    try:
        while sent < 8 * 1024 * 1024:  # an endless header: the server answers long before
            sock.sendall(b"a" * 65536)
            sent += 65536
    except (BrokenPipeError, ConnectionResetError):
        pass
    received, _ = read_until_closed(sock, scaled(10))
    assert received.startswith(b"HTTP/1.1 431 "), received[:200]
    assert b'"code": "headers_too_large"' in received
    assert sent < 8 * 1024 * 1024  # refused while it was still coming


def test_too_many_header_lines_are_answered_431(served: Cluster) -> None:
    sock = connect(served)
    lines = b"".join(b"X-%d: 1\r\n" % n for n in range(150))
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + lines + b"\r\n")
    received, _ = read_until_closed(sock, scaled(10))
    assert received.startswith(b"HTTP/1.1 431 "), received[:200]


def test_headers_within_the_bounds_are_served_even_when_they_arrive_in_pieces(
    served: Cluster,
) -> None:
    sock = connect(served)
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * 20000 + b"\r\n\r\n"
    for i in range(0, len(request), 7000):
        sock.sendall(request[i : i + 7000])
    assert read_response(sock).startswith(b"HTTP/1.1 200 ")
    sock.sendall(request)  # the next request on the connection counts afresh
    assert read_response(sock).startswith(b"HTTP/1.1 200 ")
