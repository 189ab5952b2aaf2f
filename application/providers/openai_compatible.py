"""A provider for OpenAI-compatible chat completions with tools (OpenAI, vLLM, llama.cpp, Ollama).

The request is built from ``next_request()`` alone: every tool call the model
made is answered by a tool message (placeholders included), and the tools are
the session's, declared as OpenAI function tools. The model is the session's.

Failures, as the agent loop sees them (a ``ProviderError`` → TurnFailed)::

    ProviderError
    ├── after retries: 408, 429, 5xx, connection errors, timeouts (bounded,
    │                  jittered exponential backoff; Retry-After honoured up to a cap)
    ├── at once: any other status (400, 401, 404 …), naming status and message
    └── at once: a malformed reply (not JSON, no choices, tool-call arguments
                 that are not a JSON object)

Replies are streamed (``stream: true``): the text arrives as server-sent
``data:`` chunks, each piece handed to the model call's reply sink
(``application.providers.reply_deltas``) for live subscribers, and tool calls arrive as
pieces assembled by index into whole calls. What the agent loop gets — and
stores — is the whole reply, as without streaming. A server that answers
with plain JSON instead of a stream is read as before. A stream cut before
its end (no ``[DONE]`` and no finish reason) is retried like a connection
error; the sink is told the attempt started over.

The API key is sent in the Authorization header and nowhere else: it is not
part of the request or reply objects (so never in events), never logged, and
redacted from error text a server might echo it in.
"""

from __future__ import annotations

import email.utils
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from uuid import uuid4

from pydantic import SecretStr

from turnlog.application.providers.port import ModelReply, ProviderError
from turnlog.application.providers.reply_deltas import ReplySink, current_sink
from turnlog.application.tools.port import ToolSpec
from turnlog.domain.request import Message, ModelRequest

if TYPE_CHECKING:  # imported on first use: every turnlog command would pay for it
    import httpx
from httpx_sse import EventSource

log = logging.getLogger("turnlog.providers.openai")

RETRYABLE_STATUSES = frozenset({408, 429})  # and every 5xx


@dataclass(frozen=True)
class OpenAIConfig:
    """Where the endpoint is and how patient to be with it."""

    base_url: str
    api_key: SecretStr | None = None
    default_model: str = ""
    timeout: float = 60.0
    max_retries: int = 3
    backoff: float = 0.5
    max_delay: float = 20.0


class OpenAIProvider:
    """Chat completions over httpx; the HTTP client is created on first use."""

    name = "openai"

    def __init__(
        self,
        config: OpenAIConfig,
        tool_specs: Callable[[Sequence[str]], list[ToolSpec]],
        *,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.config = config
        self._tool_specs = tool_specs
        self._transport = transport
        self._sleep = sleep
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return self.config.base_url.rstrip("/") + "/chat/completions"

    def complete(self, request: ModelRequest) -> ModelReply:
        chosen_none = request.tools_chosen and not request.tools
        specs = [] if chosen_none else self._tool_specs(request.tools)
        body = request_body(request, specs, self.config.default_model)
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        return self._post(body, current_sink())

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    # ------------------------------------------------------------------ HTTP

    def _client_once(self) -> httpx.Client:
        import httpx

        with self._lock:
            if self._client is None:
                self._client = httpx.Client(
                    timeout=httpx.Timeout(self.config.timeout), transport=self._transport
                )
            return self._client

    def _headers(self) -> dict[str, str]:
        key = self.config.api_key.get_secret_value() if self.config.api_key else ""
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _post(self, body: dict[str, Any], sink: ReplySink) -> ModelReply:
        import httpx

        client = self._client_once()
        attempts = self.config.max_retries + 1
        for attempt in range(1, attempts + 1):
            problem, retry_after = "", None
            sink.restart()
            try:
                with client.stream(
                    "POST", self.url, json=body, headers=self._headers()
                ) as response:
                    if response.is_success:
                        return self._read(response, sink)
                    response.read()
                    problem = f"HTTP {response.status_code}: {self._error_text(response)}"
                    if not _retryable(response.status_code):
                        raise ProviderError(f"{self.url} answered {problem}")
                    retry_after = retry_after_seconds(response.headers)
            except httpx.TimeoutException:
                problem = f"no reply within {self.config.timeout:g}s (timeout)"
            except httpx.TransportError as exc:
                problem = f"connection error ({type(exc).__name__}: {self._redact(str(exc))})"
            except StreamBroken as exc:
                problem = self._redact(str(exc))
            if attempt == attempts:
                raise ProviderError(f"{self.url} failed after {attempts} attempts; last: {problem}")
            delay = self._delay(attempt, retry_after)
            log.warning(
                "model request failed (%s); retry %d of %d in %.2fs",
                problem,
                attempt,
                attempts - 1,
                delay,
            )
            self._sleep(delay)
        raise AssertionError("unreachable")

    def _read(self, response: httpx.Response, sink: ReplySink) -> ModelReply:
        """The whole reply: assembled from a stream, or read from a plain JSON body."""
        if not response.headers.get("content-type", "").startswith("text/event-stream"):
            response.read()
            return parse_reply(self._json(response))
        reply = StreamedReply()
        for data in (sse.data for sse in EventSource(response).iter_sse()):
            if data.strip() == "[DONE]":
                reply.done = True
                break
            try:
                chunk = json.loads(data)
            except json.JSONDecodeError:
                snippet = self._redact(data[:200])
                raise ProviderError(
                    f"malformed reply from {self.url}: a stream chunk is not JSON: {snippet!r}"
                ) from None
            sink.text(reply.add(chunk))
        return reply.whole()

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        """Retry-After when the server gave one, else jittered exponential backoff; capped."""
        cap = self.config.max_delay
        if retry_after is not None:
            return min(cap, max(0.0, retry_after))
        base = min(cap, self.config.backoff * 2.0 ** (attempt - 1))
        # Jitter spreads the retries of many workers hit by the same outage.
        return base * (0.5 + random.random() / 2)

    def _json(self, response: httpx.Response) -> Any:
        try:
            return response.json()
        except ValueError:
            snippet = self._redact(response.text[:200])
            raise ProviderError(f"malformed reply from {self.url}: not JSON: {snippet!r}") from None

    def _error_text(self, response: httpx.Response) -> str:
        try:
            error = response.json().get("error")
            text = error.get("message") if isinstance(error, dict) else error
        except (ValueError, AttributeError):
            text = None
        text = text if isinstance(text, str) and text else response.text[:300]
        if response.status_code == 401 and not self.config.api_key:
            text += " (TURNLOG_OPENAI_API_KEY is not set)"
        return self._redact(text)

    def _redact(self, text: str) -> str:
        key = self.config.api_key.get_secret_value() if self.config.api_key else ""
        return text.replace(key, "***") if key else text


def _retryable(status: int) -> bool:
    return status in RETRYABLE_STATUSES or status >= 500


def retry_after_seconds(headers: httpx.Headers) -> float | None:
    """The wait a server asked for: retry-after-ms, or Retry-After in seconds or as a date."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return float(value) * scale
        except ValueError:
            pass
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            continue
        return (when - datetime.now(UTC)).total_seconds()
    return None


# -------------------------------------------------------------- mapping


def request_body(
    request: ModelRequest, specs: Sequence[ToolSpec], default_model: str
) -> dict[str, Any]:
    """The chat-completions body for a model request."""
    body: dict[str, Any] = {
        "model": request.model or default_model,
        "messages": [_message(m) for m in request.messages],
    }
    if specs:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": s.name,
                    "description": s.description,
                    "parameters": s.parameters,
                },
            }
            for s in specs
        ]
    return body


def _message(message: Message) -> dict[str, Any]:
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    if message.role == "assistant" and message.tool_calls:
        return {
            "role": "assistant",
            "content": message.content or None,
            "tool_calls": [
                {
                    "id": c["call_id"],
                    "type": "function",
                    "function": {
                        "name": c["name"],
                        "arguments": json.dumps(c["arguments"], ensure_ascii=False),
                    },
                }
                for c in message.tool_calls
            ],
        }
    return {"role": message.role, "content": message.content}


def parse_reply(data: Any) -> ModelReply:
    """Text, tool calls (arguments parsed from JSON) and usage of a chat completion."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ProviderError("malformed reply: no choices")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise ProviderError("malformed reply: the first choice has no message")
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise ProviderError("malformed reply: tool_calls is not a list")
    usage = data.get("usage")
    return ModelReply(
        text=_text(message),
        tool_calls=tuple(_tool_call(c) for c in calls),
        usage={k: v for k, v in usage.items() if isinstance(v, int)}
        if isinstance(usage, dict)
        else {},
    )


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if content is None:
        refusal = message.get("refusal")
        return refusal if isinstance(refusal, str) else ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        parts = [p for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return "".join(str(p.get("text", "")) for p in parts)
    raise ProviderError("malformed reply: message content is neither text nor parts")


def _tool_call(call: Any) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or not name:
        raise ProviderError("malformed reply: a tool call has no function name")
    # Some servers omit ids; the session needs one per call, unique.
    call_id = call.get("id") or f"call_{uuid4().hex[:24]}"
    raw = function.get("arguments") if isinstance(function, dict) else None
    return {"call_id": str(call_id), "name": name, "arguments": _arguments(call_id, name, raw)}


def _arguments(call_id: str, name: str, raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):  # a few servers send an object instead of a JSON string
        return raw
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    try:
        value = json.loads(raw) if isinstance(raw, str) else None
    except json.JSONDecodeError as exc:
        raise ProviderError(
            f"the model's arguments for tool call {call_id} ({name}) are not valid JSON: "
            f"{exc.msg} at position {exc.pos}"
        ) from None
    if not isinstance(value, dict):
        raise ProviderError(
            f"the model's arguments for tool call {call_id} ({name}) are not a JSON object"
        )
    return value


# -------------------------------------------------------------- streaming


class StreamBroken(Exception):
    """A stream that ended early or carried an error: retried like a connection error."""


@dataclass
class StreamedReply:
    """A chat completion assembled from its chunks: text pieces, tool calls by index, usage."""

    text: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    usage: dict[str, Any] | None = None
    finished: bool = False
    done: bool = False

    def add(self, chunk: Any) -> str:
        """Take one chunk; returns the text it adds to the reply ('' for none)."""
        if not isinstance(chunk, dict):
            raise ProviderError("malformed reply: a stream chunk is not a JSON object")
        if "error" in chunk:
            error = chunk["error"]
            text = error.get("message") if isinstance(error, dict) else error
            raise StreamBroken(f"the stream carried an error: {str(text)[:300]}")
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choices = chunk.get("choices") or []
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return ""  # the usage chunk (no choices) or a keep-alive
        choice = choices[0]
        if choice.get("finish_reason"):
            self.finished = True
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return ""
        for index, call in enumerate(delta.get("tool_calls") or []):
            self._add_call(index, call)
        piece = _piece(delta.get("content"))
        self.text.append(piece)
        return piece

    def _add_call(self, position: int, call: Any) -> None:
        if not isinstance(call, dict):
            raise ProviderError("malformed reply: a streamed tool call is not an object")
        index = call.get("index", position)
        whole = self.calls.setdefault(index if isinstance(index, int) else position, {})
        if call.get("id") and not whole.get("id"):
            whole["id"] = call["id"]
        function = call.get("function")
        if not isinstance(function, dict):
            function = {}
        name = function.get("name")
        if isinstance(name, str) and name and not whole.get("name"):
            whole["name"] = name
        arguments = function.get("arguments")
        if isinstance(arguments, dict):  # a few servers send an object, whole
            whole["arguments"] = arguments
        elif isinstance(arguments, str):
            whole["arguments"] = whole.get("arguments", "") + arguments

    def whole(self) -> ModelReply:
        if not (self.done or self.finished):
            raise StreamBroken("the stream ended before the reply was complete")
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.text)}
        if self.calls:
            message["tool_calls"] = [
                {
                    "id": c.get("id"),
                    "type": "function",
                    "function": {"name": c.get("name"), "arguments": c.get("arguments")},
                }
                for _, c in sorted(self.calls.items())
            ]
        return parse_reply({"choices": [{"message": message}], "usage": self.usage})


def _piece(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""
