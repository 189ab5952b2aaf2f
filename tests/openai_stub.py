"""A local OpenAI-compatible server for tests: each request gets the next scripted answer.

It is a real HTTP server (stdlib ``http.server``, one thread per request) on
127.0.0.1 and a free port, so the provider is exercised over real sockets:
headers, status codes, Retry-After, timeouts, bodies that are not JSON.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.deadlines import scaled


@dataclass(frozen=True)
class Received:
    """One request as the stub saw it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.json["messages"])


@dataclass(frozen=True)
class Answer:
    """A scripted answer: status, headers, body; or ``hang`` until the stub stops."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    hang: bool = False
    # A streamed answer: these server-sent event frames, one write each. With
    # ``hold`` set, the stub waits for it after ``hold_after`` frames.
    frames: tuple[bytes, ...] = ()
    hold: threading.Event | None = None
    hold_after: int = 0


def completion(message: dict[str, Any], usage: dict[str, int] | None = None) -> Answer:
    body = {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "model": "stub",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": usage or {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
    }
    return Answer(200, json.dumps(body).encode(), {"Content-Type": "application/json"})


def reply(text: str, usage: dict[str, int] | None = None) -> Answer:
    return completion({"role": "assistant", "content": text}, usage)


def tool_calls(*calls: tuple[str, str, str]) -> Answer:
    """(call id, tool name, arguments as the raw JSON string the model produced)."""
    return completion(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
                for cid, name, args in calls
            ],
        }
    )


def status(code: int, error: str = "", **headers: str) -> Answer:
    body = json.dumps({"error": {"message": error or f"stub status {code}"}}).encode()
    return Answer(code, body, {"Content-Type": "application/json", **headers})


def raw(body: bytes, code: int = 200) -> Answer:
    return Answer(code, body, {"Content-Type": "application/json"})


HANG = Answer(hang=True)


def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {
        "id": "chatcmpl-stub",
        "object": "chat.completion.chunk",
        "model": "stub",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(body)}\n\n".encode()


def usage_chunk(usage: dict[str, int]) -> bytes:
    body = {"id": "chatcmpl-stub", "object": "chat.completion.chunk", "choices": [], "usage": usage}
    return f"data: {json.dumps(body)}\n\n".encode()


def pieces(text: str, count: int) -> list[str]:
    """``text`` cut into ``count`` pieces (none empty while the text is long enough)."""
    size, extra = divmod(len(text), count)
    out, start = [], 0
    for i in range(count):
        end = start + size + (1 if i < extra else 0)
        out.append(text[start:end])
        start = end
    return out


def streamed(
    text: str,
    count: int = 20,
    *,
    usage: dict[str, int] | None = None,
    hold: threading.Event | None = None,
    hold_after: int = 0,
    cut_after: int | None = None,
) -> Answer:
    """A reply streamed as ``count`` text chunks, a finish chunk, usage, then ``[DONE]``.

    ``cut_after``: the stream stops after that many text chunks (no finish, no ``[DONE]``).
    """
    frames = [chunk({"role": "assistant", "content": p}) for p in pieces(text, count)]
    if cut_after is not None:
        frames = frames[:cut_after]
    else:
        frames.append(chunk({}, finish="stop"))
        frames.append(usage_chunk(usage or {"prompt_tokens": 10, "completion_tokens": count}))
        frames.append(b"data: [DONE]\n\n")
    return Answer(
        200,
        headers={"Content-Type": "text/event-stream"},
        frames=tuple(frames),
        hold=hold,
        hold_after=hold_after,
    )


def streamed_tool_calls(*calls: tuple[str, str, str], split: int = 3) -> Answer:
    """Tool calls streamed as OpenAI does: id and name first, the arguments in ``split`` pieces."""
    frames = [b": keep-alive comment\n\n"]
    for index, (cid, name, args) in enumerate(calls):
        first = {"index": index, "id": cid, "type": "function"}
        first["function"] = {"name": name, "arguments": ""}
        frames.append(chunk({"role": "assistant", "content": None, "tool_calls": [first]}))
        for piece in pieces(args, split):
            more = {"index": index, "function": {"arguments": piece}}
            frames.append(chunk({"tool_calls": [more]}))
    frames.append(chunk({}, finish="tool_calls"))
    frames.append(b"data: [DONE]\n\n")
    return Answer(200, headers={"Content-Type": "text/event-stream"}, frames=tuple(frames))


class StubOpenAI:
    """Serves scripted answers on http://127.0.0.1:<port>/v1 and records every request."""

    def __init__(self) -> None:
        self.requests: list[Received] = []
        self._script: deque[Answer] = deque()
        self._changed = threading.Condition()
        self._stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def script(self, *answers: Answer) -> None:
        with self._changed:
            self._script.extend(answers)

    def wait_for_requests(self, count: int, deadline: float = 20.0) -> None:
        """Block until ``count`` requests arrived (woken by each arrival, not by sleeping)."""
        end = time.monotonic() + scaled(deadline)
        with self._changed:
            while len(self.requests) < count:
                left = end - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"stub got {len(self.requests)} requests, not {count}")
                self._changed.wait(left)

    def start(self) -> StubOpenAI:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # releases hanging answers
        self._server.shutdown()
        self._server.server_close()

    def _next(self, received: Received) -> Answer:
        with self._changed:
            self.requests.append(received)
            self._changed.notify_all()
            if not self._script:
                return status(500, "stub script exhausted")
            return self._script.popleft()


def _handler(stub: StubOpenAI) -> Callable[..., BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            received = Received(
                "POST",
                self.path,
                {k.lower(): v for k, v in self.headers.items()},
                self.rfile.read(length),
            )
            answer = stub._next(received)
            if answer.hang:
                stub._stopping.wait(60)
                return
            if answer.frames:
                self._stream(answer)
                return
            try:
                self.send_response(answer.status)
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test)

        def _stream(self, answer: Answer) -> None:
            try:
                self.send_response(answer.status)
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                self.send_header("Connection", "close")  # the body ends when it closes
                self.end_headers()
                self.wfile.flush()
                for sent, frame in enumerate(answer.frames):
                    if answer.hold is not None and sent == answer.hold_after:
                        answer.hold.wait(scaled(60))
                    self.wfile.write(frame)
                    self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, format: str, *args: Any) -> None:
            return None

    return Handler
