"""uvicorn's httptools protocol with read timeouts for slow clients.

uvicorn closes a keep-alive connection that stays idle after a response
(``timeout_keep_alive``), but nothing else: a client that opens a
connection and never finishes its headers, or declares a body and never
sends it, holds a connection (and a request task waiting in ``receive()``)
for as long as it likes. A few hundred such clients are a cheap way to take
a server's sockets and tasks.

So each connection here has two deadlines:

- **headers** (``TURNLOG_HEADER_TIMEOUT``): from the moment a request may
  begin (the connection opened, or the first byte after a response) to the
  end of its headers. Missed: ``408 Request Timeout`` if part of a request
  came, and the connection is closed.
- **body** (``TURNLOG_BODY_TIMEOUT``): from the end of the headers to the
  end of the declared body, however it trickles in. Missed: ``408`` if no
  response was started, the request's handler sees a disconnect, and the
  connection is closed. Bodies are bounded (1 MiB), so a whole-body deadline
  refuses no honest client that is not on a very slow link.

A request's header block is also bounded before the parser buffers it: at
most ``MAX_HEADER_BYTES`` and ``MAX_HEADER_LINES`` lines, counted as the bytes
arrive. Past either, the answer is ``431 Request Header Fields Too Large``
(problem ``headers_too_large``) and the connection is closed at once, so an
endless header costs the server no more than the bound.

The protocol is uvicorn's httptools one (a C parser), not its h11 one (pure
Python): under ``serve --split`` at 16 clients h11 was a quarter of the API
process's CPU, and this protocol took its CPU per turn down by about 7 %.
"""

from __future__ import annotations

import asyncio
import logging

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from turnlog.interface.http.errors import problem_bytes
from turnlog.interface.problems import Problem

log = logging.getLogger("turnlog.http")

MAX_HEADER_BYTES = 32 * 1024  # a request line and headers, terminator included
MAX_HEADER_LINES = 100

_TOO_LARGE_BODY = problem_bytes(
    Problem(
        status=431,
        title="Request Header Fields Too Large",
        code="headers_too_large",
        detail=f"the request line and headers may hold at most {MAX_HEADER_BYTES} bytes"
        f" in {MAX_HEADER_LINES} lines",
    ),
    None,
)
TOO_LARGE_RESPONSE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: application/problem+json\r\n"
    b"content-length: " + str(len(_TOO_LARGE_BODY)).encode() + b"\r\n"
    b"connection: close\r\n\r\n" + _TOO_LARGE_BODY
)

TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\n"
    b"content-type: text/plain; charset=utf-8\r\n"
    b"content-length: 16\r\n"
    b"connection: close\r\n\r\n"
    b"Request Timeout\n"
)


class TimedProtocol(HttpToolsProtocol):
    """HttpToolsProtocol that closes connections whose headers or body do not arrive in time."""

    header_timeout: float = 10.0
    body_timeout: float = 30.0

    _header_timer: asyncio.TimerHandle | None = None
    _body_timer: asyncio.TimerHandle | None = None
    _received: bool = False  # whether any byte of the pending request came
    _header_bytes: int = 0  # of the pending request's header block, so far
    _header_lines: int = 0
    _tail: bytes = b""  # the last bytes of it: a terminator may span two reads
    _in_body: bool = False  # between a request's headers and the end of its body

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._waiting_for_request():
            self._received = True
            self._arm_header_timer()  # after a response, the next request's clock starts
            if self._headers_too_large(data):
                log.info(
                    "request headers over %d bytes or %d lines; 431",
                    MAX_HEADER_BYTES,
                    MAX_HEADER_LINES,
                )
                self.transport.write(TOO_LARGE_RESPONSE)
                self._close()
                return
        super().data_received(data)

    def _headers_too_large(self, data: bytes) -> bool:
        """Count ``data`` into the pending header block; whether it is now over a bound."""
        window = self._tail + data
        end = window.find(b"\r\n\r\n")
        counted = window[len(self._tail) : end + 4] if end >= 0 else data
        self._header_bytes += len(counted)
        self._header_lines += (self._tail[-1:] + counted).count(b"\n")
        self._tail = b"" if end >= 0 else window[-3:]
        too_large = self._header_bytes > MAX_HEADER_BYTES or self._header_lines > MAX_HEADER_LINES
        if end >= 0:  # the block ends here: the next request counts afresh
            self._header_bytes = self._header_lines = 0
        return too_large

    def on_headers_complete(self) -> None:
        cycle = self.cycle
        super().on_headers_complete()
        if self.cycle is not cycle:  # a request's headers were complete
            self._cancel(self._header_timer)
            self._header_timer = None
            self._received = False
            self._in_body = True
            self._body_timer = self.loop.call_later(self.body_timeout, self._body_timed_out)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_body = False
        self._cancel(self._body_timer)
        self._body_timer = None

    def _waiting_for_request(self) -> bool:
        return not self._in_body and (self.cycle is None or self.cycle.response_complete)

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout, self._headers_timed_out)

    def _headers_timed_out(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or not self._waiting_for_request():
            return
        if self._received:
            log.info("request headers not received within %.0f s; closing", self.header_timeout)
            self.transport.write(TIMEOUT_RESPONSE)
        self._close()

    def _body_timed_out(self) -> None:
        self._body_timer = None
        if self.transport.is_closing() or not self._in_body:
            return
        log.info("request body not received within %.0f s; closing", self.body_timeout)
        cycle = self.cycle
        if cycle is not None and not cycle.response_started:
            cycle.response_started = cycle.response_complete = True
            self.transport.write(TIMEOUT_RESPONSE)
        if cycle is not None:
            cycle.disconnected = True  # the handler's receive() answers http.disconnect
            cycle.message_event.set()
        self._close()

    def _close(self) -> None:
        self._unset_keepalive_if_required()
        self.transport.close()

    def _cancel_timers(self) -> None:
        self._cancel(self._header_timer)
        self._cancel(self._body_timer)
        self._header_timer = self._body_timer = None

    @staticmethod
    def _cancel(timer: asyncio.TimerHandle | None) -> None:
        if timer is not None:
            timer.cancel()


def timed_protocol(header_timeout: float, body_timeout: float) -> type[TimedProtocol]:
    """The protocol class uvicorn is to use, with these deadlines (seconds)."""

    class Protocol(TimedProtocol):
        pass

    Protocol.header_timeout = header_timeout
    Protocol.body_timeout = body_timeout
    return Protocol
