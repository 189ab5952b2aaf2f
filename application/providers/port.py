"""Model providers behind one small port, and the deterministic fixture provider.

The fixture provider's reply is a pure function of the request, so a reply
that recalls something proves the request was rebuilt from stored events.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from turnlog.domain.compaction import is_summarizing
from turnlog.domain.request import SUMMARY_NAME, Message, ModelRequest


@dataclass(frozen=True)
class ModelReply:
    """What a provider answered: text, tool calls and token usage."""

    text: str
    tool_calls: tuple[dict[str, Any], ...] = ()
    usage: dict[str, Any] = field(default_factory=dict)


class ProviderError(Exception):
    """The provider could not produce a reply; the turn fails with this reason."""


class Provider(Protocol):
    """Produces the next model reply for a request."""

    name: str

    def complete(self, request: ModelRequest) -> ModelReply: ...


CODEWORD_STATEMENT = re.compile(r"\bthe codeword is\s+([^\s]+)", re.IGNORECASE)
CODEWORD_QUESTION = re.compile(r"^\s*what is the codeword\??\s*$", re.IGNORECASE)
TOOL_COMMAND = re.compile(r"^/tool\s+([A-Za-z0-9_.-]+)\s*(.*)$", re.DOTALL)
SLOW_COMMAND = re.compile(r"^/slow\s+(\d+(?:\.\d+)?)\s+(.*)$", re.DOTALL)
MAX_SLOW_SECONDS = 60.0


class FixtureProvider:
    """Deterministic, offline replies (docs/providers.md)."""

    name = "fixture"

    def complete(self, request: ModelRequest) -> ModelReply:
        messages = request.messages
        last = messages[-1] if messages else Message("user", "")
        usage = {"input_messages": len(messages)}
        if is_summarizing(request):
            return ModelReply(_summary(messages), usage=usage)
        if last.role == "tool":
            return ModelReply(f"Tool {last.name} returned: {last.content}", usage=usage)
        text = last.content
        slow = SLOW_COMMAND.match(text.strip())
        if slow:
            # "/slow N message": a model step that takes N seconds (for tests that
            # kill a worker mid-step); the reply is still a function of the request.
            time.sleep(min(float(slow.group(1)), MAX_SLOW_SECONDS))
            text = slow.group(2)
        command = TOOL_COMMAND.match(text.strip())
        if command:
            return _tool_reply(command.group(1), command.group(2), request, usage)
        if CODEWORD_QUESTION.match(text):
            word = _recall_codeword(messages[:-1])
            reply = f"The codeword is {word}." if word else "I do not know the codeword."
            return ModelReply(reply, usage=usage)
        if CODEWORD_STATEMENT.search(text):
            return ModelReply("Noted. I will remember the codeword.", usage=usage)
        return ModelReply(f"Echo: {text}", usage=usage)


def _recall_codeword(messages: Sequence[Message]) -> str:
    for message in reversed(messages):
        if message.role == "user":
            found = CODEWORD_STATEMENT.search(message.content)
            if found:
                return _word(found.group(1))
        elif message.name == SUMMARY_NAME:
            # A context summary carries the facts of the turns it replaced, in order.
            words = CODEWORD_STATEMENT.findall(message.content)
            if words:
                return _word(words[-1])
    return ""


def _word(text: str) -> str:
    return text.strip(".,;:!?\"'")


def _summary(messages: Sequence[Message]) -> str:
    """A deterministic summary: every codeword fact of the request, the latest last."""
    words: list[str] = []
    for message in messages:
        if message.role == "user" or message.name == SUMMARY_NAME:
            for word in CODEWORD_STATEMENT.findall(message.content):
                if _word(word) in words:
                    words.remove(_word(word))
                words.append(_word(word))
    users = sum(1 for m in messages[1:-1] if m.role == "user")
    facts = " ".join(f"The codeword is {w}." for w in words)
    return f"Summarised {users} more user message(s). {facts or 'No codeword was given.'}"


def _tool_reply(
    name: str, raw_arguments: str, request: ModelRequest, usage: dict[str, Any]
) -> ModelReply:
    try:
        arguments = json.loads(raw_arguments) if raw_arguments.strip() else {}
    except json.JSONDecodeError as exc:
        return ModelReply(f"Invalid tool arguments: {exc.msg}", usage=usage)
    if not isinstance(arguments, dict):
        return ModelReply("Invalid tool arguments: expected a JSON object", usage=usage)
    messages = request.messages
    if request.turn:
        # Unique within the session: the turn's number, then the request's
        # content from the turn's own message on (within a turn, each step's
        # request holds more of it). The length alone is not enough once a
        # context policy keeps requests short; the earlier turns are left out,
        # so the cost does not grow with the session.
        own = _current_turn(messages)
        content = [[m.role, m.content, m.tool_call_id, list(m.tool_calls)] for m in own]
        digest = _digest(content)
        call_id = f"call_{request.turn}_{len(messages)}_{digest}"
    else:
        # Without the turn's number (a request built by hand): as before, unique
        # while every later request of the session is longer.
        call_id = f"call_{len(messages)}_{_digest([len(messages), messages[-1].content])}"
    call = {"call_id": call_id, "name": name, "arguments": arguments}
    return ModelReply("", tool_calls=(call,), usage=usage)


def _current_turn(messages: Sequence[Message]) -> Sequence[Message]:
    """The messages from the last user message on: the turn the request is for."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role == "user":
            return messages[index:]
    return messages


def _digest(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]


class ProviderRegistry:
    """Providers by name; sessions name theirs when they start."""

    def __init__(self, providers: Sequence[Provider], default: str) -> None:
        self._providers = {p.name: p for p in providers}
        self.default = default

    def get(self, name: str) -> Provider:
        try:
            return self._providers[name or self.default]
        except KeyError:
            raise ProviderError(f"unknown provider {name!r}") from None

    def names(self) -> list[str]:
        return sorted(self._providers)

    def close(self) -> None:
        """Release what providers hold (HTTP connections)."""
        for provider in self._providers.values():
            close = getattr(provider, "close", None)
            if callable(close):
                close()
