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

from turnlog.domain.request import Message, ModelRequest


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
    """Deterministic, offline replies (DESIGN §6)."""

    name = "fixture"

    def complete(self, request: ModelRequest) -> ModelReply:
        messages = request.messages
        last = messages[-1] if messages else Message("user", "")
        usage = {"input_messages": len(messages)}
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
            return _tool_reply(command.group(1), command.group(2), messages, usage)
        if CODEWORD_QUESTION.match(text):
            word = _recall_codeword(messages[:-1])
            reply = f"The codeword is {word}." if word else "I do not know the codeword."
            return ModelReply(reply, usage=usage)
        if CODEWORD_STATEMENT.search(text):
            return ModelReply("Noted. I will remember the codeword.", usage=usage)
        return ModelReply(f"Echo: {text}", usage=usage)


def _recall_codeword(messages: Sequence[Message]) -> str:
    for message in reversed(messages):
        if message.role != "user":
            continue
        found = CODEWORD_STATEMENT.search(message.content)
        if found:
            return found.group(1).strip(".,;:!?\"'")
    return ""


def _tool_reply(
    name: str, raw_arguments: str, messages: Sequence[Message], usage: dict[str, Any]
) -> ModelReply:
    try:
        arguments = json.loads(raw_arguments) if raw_arguments.strip() else {}
    except json.JSONDecodeError as exc:
        return ModelReply(f"Invalid tool arguments: {exc.msg}", usage=usage)
    if not isinstance(arguments, dict):
        return ModelReply("Invalid tool arguments: expected a JSON object", usage=usage)
    # The call id is a function of the request, unique within the session
    # because every later request is longer.
    digest = hashlib.sha256(
        json.dumps([len(messages), messages[-1].content], ensure_ascii=False).encode()
    ).hexdigest()[:12]
    call = {"call_id": f"call_{len(messages)}_{digest}", "name": name, "arguments": arguments}
    return ModelReply("", tool_calls=(call,), usage=usage)


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
